"""diag.dump and strata compare (docs/diagnostics.md, "Dump and compare").

The dump: every launch of the dumped step with its inputs and outputs as
logical tensors; writing it changes none of the run's numbers (the losses
and gradient norms bitwise those of a run without it), and it holds the
values the run really had (the updated parameters of the last step are
params.safetensors bit for bit; the microbatch losses average to the
step's loss)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")
# configs/test.yml has every kernel op at xla; two steps, the second dumped
# (its parameters are then the run's final ones).
BASE = ["configs/test.yml", "train.steps=2", "train.eval_every=0", "ckpt.every=0", "run.progress=off",
        "obs.tensorboard=false"]
FFI = ["kernels.attention=ffi"]


def _strata(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([STRATA, *args], cwd=ROOT, capture_output=True, text=True)
    if ok and r.returncode != 0:
        raise AssertionError(f"strata {' '.join(args)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def _train(run_dir: Path, *over: str) -> Path:
    if not os.path.exists(STRATA):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    _strata("train", *BASE, *over, f"run.dir={run_dir}")
    return run_dir


def _steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("compare")
    return {
        "ffi": _train(tmp / "ffi", *FFI, "diag.dump=step:2"),
        "plain": _train(tmp / "plain", *FFI),
    }


def _index(run_dir: Path, step: int = 2) -> dict:
    return json.loads((run_dir / "dump" / f"step_{step}" / "index.json").read_text())


def test_dump_changes_no_number(runs: dict[str, Path]) -> None:
    got, want = _steps(runs["ffi"]), _steps(runs["plain"])
    assert [(r["loss"], r["grad_norm"]) for r in got] == [(r["loss"], r["grad_norm"]) for r in want]


def test_dump_format(runs: dict[str, Path]) -> None:
    index = _index(runs["ffi"])
    assert index["format"] == "strata-dump/1" and index["step"] == 2 and index["processes"] == 1
    assert index["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1, "pipeline": 1}
    assert index["config"]["kernels"]["attention"] == "ffi" and index["layers"] is None
    tensors = load_file(str(runs["ffi"] / "dump" / "step_2" / "tensors.safetensors"))
    entries = index["entries"]
    assert [e["seq"] for e in entries] == list(range(len(entries)))
    assert [e["op"] for e in entries] == sorted(e["op"] for e in entries), "plan order"
    for e in entries:
        assert e["kind"] in ("LAUNCH", "RECOMPUTE") and e["phase"] != "other", e["program"]
        for t in e["tensors"]:
            a = tensors[t["key"]]
            assert list(a.shape) == t["shape"] and str(a.dtype) == {"f32": "float32", "s32": "int32"}[t["dtype"]], t
    programs = [(e["program"], e["layer"], e["micro"], e["phase"]) for e in entries]
    # Two microbatches through embedding, two blocks and the head, then
    # the backward; per group the norms and the updates.
    assert programs[:4] == [("embed_fwd", -1, 0, "fwd"), ("block_fwd_res", 0, 0, "fwd"), ("block_fwd_res", 1, 0, "fwd"),
                            ("head_loss", -1, 0, "loss")]
    assert ("block_bwd_res", 0, 1, "bwd") in programs and ("adamw_block", 1, -1, "update") in programs
    names = {t["name"] for e in entries if e["program"] == "block_fwd_res" for t in e["tensors"] if t["io"] == "out"}
    assert {"y", "attn_out", "q"} <= names


def test_dump_holds_the_run_values(runs: dict[str, Path]) -> None:
    """The updates' outputs are the run's final parameters bit for bit, and
    the microbatch losses average to the step's loss (f32 values, f64 mean)."""
    index = _index(runs["ffi"])
    tensors = load_file(str(runs["ffi"] / "dump" / "step_2" / "tensors.safetensors"))
    final = load_file(str(runs["ffi"] / "params.safetensors"))
    seen = set()
    for e in index["entries"]:
        if e["phase"] != "update":
            continue
        for t in e["tensors"]:
            if t["io"] == "out" and t["role"] == "param":
                assert np.array_equal(tensors[t["key"]], final[t["slot"]]), t["slot"]
                seen.add(t["slot"])
    assert seen == set(final), sorted(set(final) - seen)
    losses = [tensors[t["key"]] for e in index["entries"] if e["phase"] == "loss" for t in e["tensors"]
              if t["io"] == "out" and t["role"] == "loss"]
    assert len(losses) == 2
    assert abs(float(np.mean(np.array(losses, dtype=np.float64))) - _steps(runs["ffi"])[1]["loss"]) < 1e-6


def test_dump_layer_range(tmp_path: Path) -> None:
    run = _train(tmp_path / "r", *FFI, "diag.dump=step:1,layers:1-1")
    index = _index(run, 1)
    assert index["layers"] == [1, 1]
    assert index["entries"] and {e["layer"] for e in index["entries"]} == {1}
    assert {e["phase"] for e in index["entries"]} == {"fwd", "bwd", "accum", "norm", "update"}


@pytest.mark.parametrize("spec,why", [("step:0", "step:N or step:N,layers:A-B"), ("step:3", "train.steps is 2"),
                                      ("step:1,layers:1-0", "0 <= A <= B"), ("step:1,layers:0-2", "model.n_layers is 2"),
                                      ("3", "step:N or step:N,layers:A-B")])
def test_dump_bad_spec(tmp_path: Path, spec: str, why: str) -> None:
    r = _strata("train", *BASE, f"diag.dump={spec}", f"run.dir={tmp_path / 'r'}", ok=False)
    assert r.returncode == 2 and "diag.dump" in r.stderr and why in r.stderr, r.stderr
