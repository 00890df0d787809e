"""Kernel ops are listed once (issue 25, item 5): adding one touches the files
docs/kernels.md's "How to add a kernel op" names, at most 6, and the fixture
op of tests/fixtures/kernel_op touched only files of those kinds.

The C side of the fixture (listed, configurable, registered, verified through
the plugin) is test_kernel_op (ctest); here: the how-to's list, the Python
registration, and that the per-op lists it replaced stay gone.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from strata_jax import kernels as K

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "kernel_op"
MAX_FILES = 6  # issue 25, item 5


def _howto() -> tuple[int, list[str]]:
    """(the count the how-to states, the paths of its numbered items)."""
    text = (ROOT / "docs" / "kernels.md").read_text(encoding="utf-8")
    start = text.index("<!-- kernel-op-files:")
    end = text.index("<!-- kernel-op-files: end -->")
    block = text[start:end]
    stated = int(re.search(r"^Files touched: (\d+)$", block, re.M).group(1))  # type: ignore[union-attr]
    paths = re.findall(r"^\d+\. `([^`]+)`", block, re.M)
    return stated, paths


def test_the_howto_names_at_most_six_files_and_says_how_many() -> None:
    stated, paths = _howto()
    assert stated == len(paths), (stated, paths)
    assert stated <= MAX_FILES, paths
    assert len(set(paths)) == len(paths), paths
    for p in paths:
        where = ROOT / p.replace("<op>.c", "")
        assert where.exists(), f"docs/kernels.md's how-to names {p}, which does not exist"


# Each file of the fixture op, by the kind of file it stands for in the how-to.
_FIXTURE_KINDS = {
    "square.json": "python/strata_jax/kernel_contract.json",  # the contract row (merged in by CMakeLists.txt)
    "kernel_op_fixture.py": "python/strata_jax/kernels.py",   # the implementations, @implements
    "square.c": "src/kernels/<op>.c",                         # the C kernel and its handlers
}
_FIXTURE_DRIVERS = {"test_kernel_op.c"}  # the test itself


def test_the_fixture_op_touched_only_files_the_howto_names() -> None:
    _, paths = _howto()
    files = {p.name for p in FIXTURE.iterdir() if p.is_file() and p.name != "__pycache__"}
    assert files - _FIXTURE_DRIVERS == set(_FIXTURE_KINDS), files
    for name, kind in _FIXTURE_KINDS.items():
        assert kind in paths, f"{name} stands for {kind}, which the how-to does not name"
    # The fixture's row is a complete contract row: every field a shipped row has.
    row = json.loads((FIXTURE / "square.json").read_text(encoding="utf-8"))
    assert set(K.CONTRACT["ops"][0]) <= set(row), set(K.CONTRACT["ops"][0]) - set(row)


# Files that once listed every op and now derive the list from the contract.
_DERIVED = ["src/config/schema.c", "src/plan/options.c", "src/kernels/handlers.c", "src/kernels/check.c",
            "src/kernels/verify.c", "src/kernels/contract.c", "include/strata/train.h",
            "python/strata_jax/kernel_verify.py"]


@pytest.mark.parametrize("path", _DERIVED)
def test_no_per_op_list_is_written_out(path: str) -> None:
    text = (ROOT / path).read_text(encoding="utf-8")
    if path.endswith(".py"):
        text = text.split('"""', 2)[2]  # the module's docstring shows an index.json of rmsnorm
    named = [op for op in K.OPS if re.search(rf'"{op}"|\bkernels\.{op}\b', text)]
    assert not named, f"{path} names kernel ops {named}: derive the list from the contract"


def test_every_contract_implementation_is_registered() -> None:
    assert K.unregistered() == []
    with pytest.raises(ValueError, match="no such op or implementation"):
        K.implements("no_such_op", "xla")
    with pytest.raises(ValueError, match="no such op or implementation"):
        K.implements("rmsnorm", "cuda")


def test_the_fixture_op_is_picked_up_by_the_front_end(tmp_path: Path) -> None:
    """In a child process (the fixture adds its op to the process's contract):
    registered, selectable, exported for verification, and in the manifest."""
    code = f"""
import json, sys
sys.path.insert(0, {str(FIXTURE)!r})
import kernel_op_fixture
from strata_jax import kernels as K, kernel_verify
assert K.unregistered() == [], K.unregistered()
K.check_selection({{"square": "ffi"}})
index = kernel_verify.export({str(tmp_path)!r}, "square")
ffi = [c for c in index["cases"] if c["impl"] == "ffi"]
text = open({str(tmp_path)!r} + "/" + ffi[0]["file"]).read()
entry = [e for e in K.manifest_entry({{"square": "ffi"}})["ops"] if e["name"] == "square"][0]
print(json.dumps({{"cases": len(index["cases"]), "ffi": len(ffi), "target": "strata_square_fwd_v1" in text,
                  "targets": entry["targets"], "doc_kept_out": "config_doc" not in entry["contract"]}}))
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}).stdout
    got = json.loads(out.strip().splitlines()[-1])
    # 2 verify shapes x fwd/bwd x xla/ffi.
    assert got == {"cases": 8, "ffi": 4, "target": True, "targets": ["strata_square_fwd_v1", "strata_square_bwd_v1"],
                   "doc_kept_out": True}
