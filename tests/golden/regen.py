"""Regenerate (or only check) the golden records (tests/golden/README.md).

    .venv/bin/python tests/golden/regen.py --reason "why the numbers may change" [CASE ...]
    .venv/bin/python tests/golden/regen.py --check [CASE ...]       # compare, write nothing
    make golden REASON="..."                                          # the first, every case

Runs each case (strata train, the suite's cache), compares the run with the
committed record and prints what changed: the first comparison over its
tolerance (case, step, layer, tensor, statistic, old vs new, relative
change), then the rest by place, and how many bf16 hashes changed. With
--reason it writes the records, the reason in each (`reason`); the commit
that carries them repeats it. A record is written only when something
changed beyond rounding, or when it is new, unless --force.
Exit status: 0 done (or, with --check, every case within tolerance), 1 a case
differs (--check) or a run failed, 2 usage.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import golden as G  # noqa: E402
from cases import CASES  # noqa: E402


def _hash_changes(old: dict, new: dict) -> int:
    if "tensors" not in old or "tensors" not in new:
        return 0
    key = lambda r: (r["phase"], r["stage"], r["layer"], r["micro"], r["name"])  # noqa: E731
    o = {key(r): r["bf16_sha256"] for r in old["tensors"]}
    return sum(1 for r in new["tensors"] if o.get(key(r)) not in (None, r["bf16_sha256"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tests/golden/regen.py", description=__doc__.strip().splitlines()[0])
    ap.add_argument("cases", nargs="*", help="case names (default: all): " + ", ".join(c.name for c in CASES))
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--reason", help="why the numbers may change: written into each record")
    mode.add_argument("--check", action="store_true", help="compare with the records, write nothing")
    ap.add_argument("--force", action="store_true", help="write every record, even one within tolerance")
    a = ap.parse_args(argv)
    names = a.cases or [c.name for c in CASES]
    unknown = [n for n in names if n not in G.BY_NAME]
    if unknown:
        print(f"regen.py: unknown case(s) {', '.join(unknown)}; known: {', '.join(c.name for c in CASES)}",
              file=sys.stderr)
        return 2
    if a.reason is not None and not a.reason.strip():
        print("regen.py: --reason must say why the numbers may change", file=sys.stderr)
        return 2
    rc = 0
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        for name in names:
            try:
                new = G.run_case(G.BY_NAME[name], Path(tmp) / name)
            except RuntimeError as e:
                print(f"{name}: the run failed:\n{e}", file=sys.stderr)
                rc = 1
                continue
            path = G.RECORDS / f"{name}.json"
            old = G.load(name) if path.exists() else None
            if old is None:
                print(f"{name}: no record yet")
                changed = True
            else:
                checks = G.compare(old, new)
                print(G.describe(name, checks))
                hashes = _hash_changes(old, new)
                if hashes:
                    print(f"  {hashes} tensors' bf16 hashes changed (reported, not asserted: README.md)")
                changed = bool(G.failures(checks))
                if a.check and changed:
                    rc = 1
            if a.reason is not None and (changed or a.force):
                new["reason"] = a.reason.strip()
                new["generated"] = G.provenance()
                print(f"  wrote {G.save(new).relative_to(G.ROOT)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
