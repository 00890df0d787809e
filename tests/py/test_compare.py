"""diag.dump and strata compare (docs/diagnostics.md, "Dump and compare").

The dump: every launch of the dumped step with its inputs and outputs as
logical tensors; writing it changes none of the run's numbers (the loss
and gradient norm bitwise those of a run without it), and it holds the
values the run really had (the updated parameters are params.safetensors
bit for bit; the microbatch losses average to the step's loss).

strata compare: ffi attention against xla, and fsdp=2 against one device,
have no tensor over budget (exit 0); a deliberately wrong attention kernel
(faults.wrong_kernel=attention) is named: the block forward of layer 0,
microbatch 0, its attention output attn_out (exit 1); bad input is exit 2
naming the file. Every run is one step (the dumped step is the last: its
updates are the final parameters)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from mpjob import MPI_ENV, MPIRUN
from test_data_parallel import OVERRIDES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")
# configs/test.yml (every kernel op at xla) with test_data_parallel's model:
# its one-device and fsdp=2 bundles are the ones test_data_parallel.py and
# test_fsdp.py export, so make test exports one more here (ffi attention).
BASE = ["configs/test.yml", *OVERRIDES, "train.steps=1", "train.eval_every=0", "ckpt.every=0", "run.progress=off",
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


# The runs the tests compare, each trained on first use (make test-long's
# fsdp, remat and two-process comparisons train theirs only there).
RUNS: dict[str, list[str]] = {
    "ffi": [*FFI, "diag.dump=step:1"],
    "plain": [*FFI],
    "xla": ["diag.dump=step:1"],
    "wrong": [*FFI, "faults.wrong_kernel=attention", "diag.dump=step:1"],
    "fsdp": ["runtime.cpu_devices=2", "parallel.fsdp=2", "diag.dump=step:1"],
    "remat": ["sched.remat=full", "diag.dump=step:1"],
}


class _Runs(dict):
    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, name: str) -> Path:
        self[name] = _train(self.tmp / name, *RUNS[name])
        return self[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Runs(tmp_path_factory.mktemp("compare"))


def _index(run_dir: Path, step: int = 1) -> dict:
    return json.loads((run_dir / "dump" / f"step_{step}" / "index.json").read_text())


def test_dump_changes_no_number(runs: dict[str, Path]) -> None:
    got, want = _steps(runs["ffi"]), _steps(runs["plain"])
    assert [(r["loss"], r["grad_norm"]) for r in got] == [(r["loss"], r["grad_norm"]) for r in want]


def test_dump_format(runs: dict[str, Path]) -> None:
    index = _index(runs["ffi"])
    assert index["format"] == "strata-dump/1" and index["step"] == 1 and index["processes"] == 1
    assert index["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1, "pipeline": 1}
    assert index["config"]["kernels"]["attention"] == "ffi" and index["layers"] is None
    tensors = load_file(str(runs["ffi"] / "dump" / "step_1" / "tensors.safetensors"))
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
    tensors = load_file(str(runs["ffi"] / "dump" / "step_1" / "tensors.safetensors"))
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
    assert abs(float(np.mean(np.array(losses, dtype=np.float64))) - _steps(runs["ffi"])[0]["loss"]) < 1e-6


def test_dump_layer_range(tmp_path: Path) -> None:
    run = _train(tmp_path / "r", *FFI, "diag.dump=step:1,layers:1-1")
    index = _index(run, 1)
    assert index["layers"] == [1, 1]
    assert index["entries"] and {e["layer"] for e in index["entries"]} == {1}
    assert {e["phase"] for e in index["entries"]} == {"fwd", "bwd", "accum", "norm", "update"}


@pytest.mark.parametrize("spec,why", [("step:0", "step:N or step:N,layers:A-B"), ("step:2", "train.steps is 1"),
                                      ("step:1,layers:1-0", "0 <= A <= B"), ("step:1,layers:0-2", "model.n_layers is 2"),
                                      ("3", "step:N or step:N,layers:A-B")])
def test_dump_bad_spec(tmp_path: Path, spec: str, why: str) -> None:
    r = _strata("train", *BASE, f"diag.dump={spec}", f"run.dir={tmp_path / 'r'}", ok=False)
    assert r.returncode == 2 and "diag.dump" in r.stderr and why in r.stderr, r.stderr


def _compare(a: Path, b: Path, *extra: str) -> tuple[int, dict, str]:
    r = _strata("compare", str(a), str(b), "--json", *extra, ok=False)
    assert r.returncode in (0, 1), r.stderr
    text = _strata("compare", str(a), str(b), *extra, ok=False)
    assert text.returncode == r.returncode
    return r.returncode, json.loads(r.stdout), text.stdout


@pytest.mark.long
def test_fsdp_dump_is_logical(runs: dict[str, Path]) -> None:
    """fsdp=2's tensors have the one-device run's shapes (blocks joined
    without their padding, rows concatenated), program by program."""
    def shapes(index: dict) -> dict:
        return {(e["program"].replace("_fsdp2", ""), e["layer"], e["micro"], t["io"], t["name"]): t["shape"]
                for e in index["entries"] for t in e["tensors"]}

    two = _index(runs["fsdp"])
    assert two["mesh"]["fsdp"] == 2 and any(e["program"].endswith("_fsdp2") for e in two["entries"])
    assert shapes(two) == shapes(_index(runs["xla"]))


@pytest.mark.parametrize("other", ["ffi", pytest.param("fsdp", marks=pytest.mark.long)])
def test_compare_within_budget(runs: dict[str, Path], other: str) -> None:
    """ffi attention against xla, fsdp=2 against one device: no tensor over
    budget, every tensor matched; the closest stays below its budget by a
    margin (the budgets are not tuned to the edge)."""
    code, r, text = _compare(runs[other], runs["xla"])
    assert code == 0 and r["over_budget"] == 0 and r["first"] is None, text
    assert r["compared"] > 300 and r["only_a"] == 0 and r["only_b"] == 0, text
    assert 0 <= r["max_ratio"] < 0.5, text
    assert "no tensor over budget" in text


@pytest.mark.long
def test_compare_across_remat(runs: dict[str, Path]) -> None:
    """sched.remat=full against residuals kept: the RECOMPUTE's residuals
    meet the forward's (a recompute matches as a forward); only its
    repeated inputs and output y, a second occurrence, have no match."""
    code, r, text = _compare(runs["remat"], runs["xla"])
    assert code == 0 and r["over_budget"] == 0 and r["compared"] > 300 and r["only_b"] == 0, text
    assert r["only_a"] > 0 and all(k.startswith("fwd|block|") and k.endswith("|1") for k in r["only_a_examples"]), text
    assert any(e["kind"] == "RECOMPUTE" for e in _index(runs["remat"])["entries"])


def test_compare_names_the_wrong_kernel(runs: dict[str, Path]) -> None:
    code, r, text = _compare(runs["wrong"], runs["xla"])
    assert code == 1 and r["differ"], text
    f = r["first"]
    assert (f["program"], f["layer"], f["micro"], f["phase"]) == ("block_fwd_res", 0, 0, "fwd"), f
    assert f["tensor"]["tensor"] == "attn_out" and f["tensor"]["io"] == "out" and f["inputs_within_budget"], f
    # o scaled by 1 + 2^-10: the largest relative difference is that
    assert abs(f["tensor"]["max_rel"] - 2.0 ** -10) < 2.0 ** -16 and f["tensor"]["budget"] < 2.0 ** -12, f
    assert "first over budget: program block_fwd_res" in text and "layer 0, microbatch 0" in text
    assert "tensor attn_out (output activation" in text
    layers = {x["where"]: x for x in r["by_layer"]}
    assert layers["layer 1"]["over_budget"] > 0 and layers["embed"]["compared"] > 0


def test_compare_bad_input(runs: dict[str, Path], tmp_path: Path) -> None:
    def bad(a: Path, b: Path, want: str, *extra: str) -> None:
        r = _strata("compare", str(a), str(b), *extra, ok=False)
        assert r.returncode == 2 and want in r.stderr, r.stderr

    bad(tmp_path, runs["xla"], f"{tmp_path} is not a dump")
    bad(runs["plain"], runs["xla"], "is not a dump")
    cut = tmp_path / "cut"
    shutil.copytree(runs["ffi"] / "dump", cut / "dump")
    st = cut / "dump" / "step_1" / "tensors.safetensors"
    st.write_bytes(st.read_bytes()[:5000])
    bad(cut, runs["xla"], f"{st}: header length")
    bad(runs["ffi"], runs["xla"], "has no dump of step 2 (it has steps 1)", "--step", "2")
    other = tmp_path / "other" / "dump" / "step_2"
    shutil.copytree(runs["xla"] / "dump" / "step_1", other)
    index = json.loads((other / "index.json").read_text())
    index["step"] = 2
    (other / "index.json").write_text(json.dumps(index))
    bad(runs["ffi"] / "dump" / "step_1", other, "mismatched steps")
    index["format"] = "strata-dump/9"
    (other / "index.json").write_text(json.dumps(index))
    bad(runs["ffi"] / "dump" / "step_1", other, 'format is "strata-dump/9"')
    index["format"] = "strata-dump/1"
    index["entries"][0]["tensors"][0]["key"] = "nowhere"
    (other / "index.json").write_text(json.dumps(index))
    bad(runs["ffi"] / "dump" / "step_1", other, "has no tensor 'nowhere'")


@pytest.mark.long
def test_compare_a_job_of_two_processes(runs: dict[str, Path], tmp_path: Path) -> None:
    """parallel.data across two processes (one device each): every rank
    writes its rows, rank 0 joins them; the job's dump meets the
    one-device run's within budget, tensor for tensor."""
    assert MPIRUN, "mpirun not found: make setup installs openmpi-bin"
    job = tmp_path / "job"
    cmd = [MPIRUN, "-np", "2", STRATA, "train", *BASE, "parallel.data=2", "runtime.cpu_devices=1", "diag.dump=step:1",
           f"run.dir={job}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=MPI_ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _index(job)["processes"] == 2 and (job / "ranks" / "1" / "dump" / "step_1" / "index.json").exists()
    code, rep, text = _compare(job, runs["xla"])
    assert code == 0 and rep["compared"] > 300 and rep["only_a"] == 0 and rep["max_ratio"] < 0.5, text


def test_wrong_kernel_needs_ffi_attention(tmp_path: Path) -> None:
    r = _strata("train", *BASE, "faults.wrong_kernel=attention", f"run.dir={tmp_path / 'r'}", ok=False)
    assert r.returncode == 2 and "set kernels.attention=ffi" in r.stderr, r.stderr
