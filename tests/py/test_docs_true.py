"""The design page stays true mechanically (issue 24, item 7).

docs/design.md's "Not built yet" section names what does not exist. A config
key or a `strata` command quoted there that the binary has is a contradiction
(it was built and the page was not updated): these tests read the schema and
the command table from the binary itself, so they fail the day the feature
lands until the page moves it out of the list. A claim that no code path
exits with some code, anywhere in docs/, is checked against the exit codes
include/strata/status.h maps its failure classes to.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STRATA = os.environ.get("STRATA", str(ROOT / "build" / "strata"))


def _not_built_section() -> str:
    text = (ROOT / "docs" / "design.md").read_text()
    start = text.index("## 10. Not built yet")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def _schema_keys() -> set[str]:
    out = subprocess.run([STRATA, "config", "--schema"], check=True, capture_output=True, text=True).stdout
    return set(re.findall(r"^\| `([a-z_]+(?:\.[a-z_0-9]+)+)` \|", out, re.M))


def _commands() -> set[str]:
    r = subprocess.run([STRATA], capture_output=True, text=True)
    table = r.stdout + r.stderr
    return set(re.findall(r"^  ([a-z]+) ", table.split("commands:", 1)[1], re.M))


def _quoted(section: str) -> list[str]:
    return re.findall(r"`([^`]+)`", section)


def test_schema_and_command_table_are_read() -> None:
    """The readers below see the real tables (a broken regex would make the
    other tests vacuous)."""
    keys, cmds = _schema_keys(), _commands()
    assert {"model.d_model", "faults.nan_at", "parallel.tensor", "diag.hang_timeout_s"} <= keys, sorted(keys)[:10]
    assert {"train", "resume", "eval", "sample", "repro", "plan"} <= cmds, cmds


def test_not_built_names_no_existing_key_or_command() -> None:
    section = _not_built_section()
    keys, cmds = _schema_keys(), _commands()
    built = []
    for q in _quoted(section):
        if q in keys:
            built.append(f"config key `{q}` exists (strata config --schema)")
        m = re.fullmatch(r"strata ([a-z]+)", q)
        if m and m.group(1) in cmds:
            built.append(f"command `{q}` exists (strata's command table)")
    assert not built, "docs/design.md, 'Not built yet', names what is built: " + "; ".join(built)


def test_the_check_catches_a_built_key() -> None:
    """A section quoting a real key is caught: the rule can fail."""
    keys = _schema_keys()
    assert [q for q in _quoted("- **X**: `faults.hang_in` and `strata foo`.") if q in keys] == ["faults.hang_in"]


def _exit_codes() -> set[int]:
    text = (ROOT / "include" / "strata" / "status.h").read_text()
    header = text[: text.index("*/")]
    return {int(n) for n in re.findall(r"exit (\d+)\s*$", header, re.M)}


def test_no_doc_denies_an_exit_code_strata_uses() -> None:
    codes = _exit_codes()
    assert {2, 3, 4, 5, 6, 7, 8, 9, 1} <= codes, codes
    wrong = []
    for md in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        flat = " ".join(md.read_text().split())
        for m in re.finditer(r"nothing exits (\d+)|[Ee]xit (\d+) is reserved", flat):
            n = int(m.group(1) or m.group(2))
            if n in codes:
                wrong.append(f"{md.relative_to(ROOT)}: '{m.group(0)}' but status.h maps a class to exit {n}")
    assert not wrong, "; ".join(wrong)
