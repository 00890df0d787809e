"""Golden numerics (issue 30 item 1; tests/golden/README.md): every preset's
test-sized run against its committed record, with tolerances from rounding
error analysis, and the check's power to name where a change starts.

- test_golden_case: each case of tests/golden/cases.py that is `quick` (all
  of them today) trains 20 steps with step 1 dumped and compares with
  tests/golden/records/<case>.json.
- test_first_difference_is_named: the cheap twin of the mutation drill: a
  record perturbed from one layer's forward on (as a changed constant in
  that layer's math would) fails naming that layer and tensor first; the same
  perturbation at a quarter of the tolerance passes.
- test_mutated_block_constant_is_named (make test-long): the front-end copied,
  one constant of the parallel block kind's math changed (its MLP branch
  weight, 1 -> 1.01), exported and trained: the check fails naming layer 1
  (the first parallel layer of llama-mix-tiny) and its forward output.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "golden"))
import golden as G  # noqa: E402
from cases import CASES  # noqa: E402


@pytest.mark.parametrize("name", [c.name if c.quick else pytest.param(c.name, marks=pytest.mark.long) for c in CASES])
def test_golden_case(name: str, tmp_path: Path) -> None:
    if not G.STRATA.exists():
        raise AssertionError(f"{G.STRATA} is missing: run `make build` first (make test does)")
    want = G.load(name)
    got = G.run_case(G.BY_NAME[name], tmp_path)
    assert "tensors" in got, "the run wrote no step dump (diag.dump=step:1)"
    checks = G.compare(want, got)
    report = G.describe(name, checks)
    print(report)
    assert not G.failures(checks), report + "\n(if the change is intended: tests/golden/regen.py --reason ...)"


def _perturb_from(rec: dict, seq: int, rel: float) -> dict:
    """|rec| with every dumped tensor from plan position |seq| on, every
    per-stage statistic and every step's loss scaled by 1 + rel: what a
    change in one layer's math does downstream. Updates are left alone:
    their budget is AdamW's (one ulp of the parameter), not a relative one."""
    out = copy.deepcopy(rec)
    for r in out["tensors"]:
        if r["seq"] >= seq and r["class"] != "update":
            r["norm"] *= 1 + rel
            r["maxabs"] *= 1 + rel
            r["values"] = [v * (1 + rel) for v in r["values"]]
    for r in out["layers"]:
        for k in ("rms", "maxabs"):
            if k in r and r["tensor"] not in ("param", "update"):
                r[k] *= 1 + rel
    for s in out["steps"]:
        s["loss"] *= 1 + rel
    return out


def test_first_difference_is_named() -> None:
    rec = G.load("llama-mix-tiny")
    assert G.failures(G.compare(rec, rec)) == []
    # layer 1 (parallel)'s forward, micro 0: its first output is the block's y
    first = next(r for r in rec["tensors"] if r["layer"] == 1 and r["phase"] == "fwd")
    shape = G.Shape.of(rec["model"], rec["train"])
    tol = G.rel_tol(shape, "out", 1)
    bad = G.failures(G.compare(rec, _perturb_from(rec, first["seq"], 20 * tol)))
    assert bad, "a change 20x the tolerance went unnoticed"
    head = bad[0]
    assert head.stage == "layer1" and head.tensor == first["name"], head.line()
    assert "layer 1 (parallel)" in head.where and first["program"] in head.where, head.where
    report = G.describe("llama-mix-tiny", G.compare(rec, _perturb_from(rec, first["seq"], 20 * tol)))
    assert report.splitlines()[0].startswith("llama-mix-tiny: ") and "first: step 1, " in report, report
    # below the tolerance: nothing flagged (every class's budget is at least the forward's)
    assert G.failures(G.compare(rec, _perturb_from(rec, first["seq"], tol / 4))) == []


def test_regen_needs_a_reason() -> None:
    r = subprocess.run([sys.executable, "tests/golden/regen.py", "--reason", " ", "test"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--reason" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "tests/golden/regen.py", "--check", "nosuchcase"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown case" in r.stderr, r.stderr


@pytest.mark.long
def test_mutated_block_constant_is_named(tmp_path: Path) -> None:
    """The acceptance drill: one constant of one kind's math changed in a
    copy of the front-end (STRATA_SOURCE_DIR: the exporter and the bundle key
    read it), so the bundle is exported again; the check must fail and name
    the first parallel layer (1) and its forward's first output."""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "python"), src / "python",
                    ignore=shutil.ignore_patterns("__pycache__"))
    os.symlink(os.path.join(ROOT, "configs"), src / "configs")
    blocks = src / "python" / "strata_jax" / "blocks.py"
    text = blocks.read_text()
    before = "return x + L.attention(cfg, p, h) + L.mlp(cfg, p, h)"
    assert text.count(before) == 1, "blocks.py's parallel_fwd changed: update the drill"
    blocks.write_text(text.replace(before, "return x + L.attention(cfg, p, h) + 1.01 * L.mlp(cfg, p, h)"))
    want = G.load("llama-mix-tiny")
    got = G.run_case(G.BY_NAME["llama-mix-tiny"], tmp_path / "run",
                     env={"STRATA_SOURCE_DIR": str(src), "STRATA_CACHE_DIR": str(tmp_path / "cache")})
    checks = G.compare(want, got)
    bad = G.failures(checks)
    print(G.describe("llama-mix-tiny (mutated)", checks))
    assert bad, "a changed constant in the parallel kind went unnoticed"
    first = next(r for r in want["tensors"] if r["layer"] == 1 and r["phase"] == "fwd")
    assert bad[0].stage == "layer1" and bad[0].tensor == first["name"], bad[0].line()
    # layer 0 (llama) is before the change: nothing of its forward differs
    assert not [c for c in bad if c.stage == "layer0" and "_fwd" in c.where], bad[:5]


def test_repro_package_records_its_inputs_golden_statistics(tmp_path: Path) -> None:
    """Issue 30 item 4b: a non-finite bundle (the NaN drill on configs/
    test.yml's shared bundle) records each input's golden statistics, the
    same numbers tensor_stats gives for inputs.safetensors (bit for bit);
    `strata repro` recomputes them before replaying, and refuses (exit 2)
    inputs that were changed."""
    import json

    run = tmp_path / "run"
    r = subprocess.run([str(G.STRATA), "train", "configs/test.yml", "model.n_layers=3", "train.steps=4",
                        "faults.nan_at=3:2", "faults.nan_micro=1", "run.progress=off", f"run.dir={run}"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 5, r.stderr
    nb = run / "diag" / "nonfinite-step3"
    meta = json.loads((nb / "nonfinite.json").read_text())
    saved = G.load_safetensors(nb / "inputs.safetensors")
    assert [s["name"] for s in meta["input_stats"]] == meta["inputs"]
    for rec in meta["input_stats"]:
        want = G.tensor_stats(saved[rec["name"]])
        assert {k: v for k, v in rec.items() if k != "name"} == want, rec["name"]
    r = subprocess.run([str(G.STRATA), "repro", str(nb)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"inputs: all {len(meta['inputs'])} have the statistics the bundle records" in r.stdout, r.stdout
    # one input element changed: the replay would not be of the recorded inputs
    raw = bytearray((nb / "inputs.safetensors").read_bytes())
    raw[-2] ^= 0x40
    (nb / "inputs.safetensors").write_bytes(bytes(raw))
    r = subprocess.run([str(G.STRATA), "repro", str(nb)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "the saved inputs were changed" in r.stderr, (r.returncode, r.stderr[-2000:])
