"""Checkpoints of a job of several processes (docs/multiprocess.md,
"Checkpoints"; docs/checkpoints.md, "A job of several processes").

A data-parallel job (`mpirun -np 2 strata train ... parallel.data=2
runtime.cpu_devices=1`) saves one checkpoint for the job: rank 0 writes it
into the job's run directory, every other rank takes part in the commit's
vote and records `ckpt_committed` in its own <run>/ranks/<r>/events.jsonl.
Its manifest records the job's mesh and process count and the one-device
bundle key, so it resumes:

- as the same job (`mpirun -np 2 strata resume RUN`): every rank, its rank
  directory included, continues from the job's newest valid checkpoint,
  bitwise the uninterrupted run (deterministic mode, same process count);
- on 1 process (one device) and on 4 processes x 1 device (data=4), and a
  one-process checkpoint on 2 processes: every loss after the resume within
  rtol 1e-5 of the uninterrupted run of the same global batch (the batch
  and its order are the same for any process count; the f32 sums are not
  added in the same order, so not bitwise);
- after rank 0 is SIGKILLed halfway through writing its save
  (faults.crash_in_save): the job ends (mpirun takes the other rank down),
  the previous checkpoint stays the newest valid one, and the job's resume
  removes the unfinished write and continues bitwise.

The uninterrupted 2-process run saves in the background (ckpt.staging=full,
ckpt.async=true): its step-3 save is learned by rank 1 at the step-6 save,
where every rank waits for it. Cuts are made by copying a run directory and
removing its newer checkpoint (the resume takes the newest valid one), so
every run has the same train.steps and LR schedule.

Small on purpose (6 steps of a tiny model; about 40 s on a loaded 2-core
machine, the 4-process resume the largest part). Processes run on loopback
with `mpirun --oversubscribe`; running as root (CI) needs Open MPI's
consent, given in the environment of the test only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mpjob import ROOT, STRATA, MPIRUN, MPI_ENV, STEPS, CUT, OVERRIDES, TIMEOUT_S, run, lines, losses, events  # noqa: F401 (shared with the other job-checkpoint tests)


def train(tmp: Path, name: str, procs: int, *extra: str, expect: int | None = 0) -> Path:
    d = tmp / name
    mesh = [f"parallel.data={procs}"] if procs > 1 else []
    run([STRATA, "train", "configs/test.yml", *OVERRIDES, *mesh, *extra, f"run.dir={d}"], procs, expect)
    return d


def cut_copy(src: Path, dst: Path) -> Path:
    """|src| as it was after step CUT: its newer checkpoints removed (the newest valid one is step CUT)."""
    shutil.copytree(src, dst)
    for ck in (dst / "checkpoints").glob("step_*"):
        if int(ck.name.split("_")[1]) > CUT:
            shutil.rmtree(ck)
    return dst


def resume(d: Path, procs: int, *extra: str) -> subprocess.CompletedProcess:
    r = run([STRATA, "resume", str(d), f"parallel.data={procs}", *extra], procs)
    (d / "resume.stderr").write_text(r.stderr)
    return r


def mesh(data: int, procs: int) -> dict:
    m = {"data": data, "fsdp": 1, "tensor": 1, "devices": data}
    if procs > 1:
        m["processes"] = procs
    return m


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not os.path.exists(STRATA):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    tmp = tmp_path_factory.mktemp("mpckpt")
    return {"tmp": tmp,
            "one": train(tmp, "one", 1),
            "two": train(tmp, "two", 2, "ckpt.staging=full", "ckpt.async=true")}


def test_the_job_saves_one_checkpoint_with_its_mesh(runs: dict) -> None:
    two, one = runs["two"], runs["one"]
    assert sorted(p.name for p in (two / "checkpoints").glob("step_*")) == [f"step_{CUT}", f"step_{STEPS}"]
    assert not (two / "ranks" / "1" / "checkpoints").exists(), "rank 1 writes no checkpoint files of its own"
    m = json.loads((two / "checkpoints" / f"step_{CUT}" / "manifest.json").read_text())
    assert m["mesh"] == mesh(2, 2)
    # The identity is the model: the one-device bundle key and the whole microbatch, as a one-process run's.
    m1 = json.loads((one / "checkpoints" / f"step_{CUT}" / "manifest.json").read_text())
    assert m1["mesh"] == mesh(1, 1)
    assert m["bundle_key"] == m1["bundle_key"] and m["model"] == m1["model"]
    # Rank 0 wrote and reported both saves (the first in the background); rank 1 learned of each commit.
    saved = events(two, "ckpt_saved")
    assert [e["step"] for e in saved] == [CUT, STEPS] and saved[0]["async"] is True
    assert [e["step"] for e in events(two / "ranks" / "1", "ckpt_committed")] == [CUT, STEPS]
    out = run([STRATA, "ckpt", "inspect", str(two / "checkpoints" / f"step_{CUT}")], 1).stdout
    assert "mesh            data=2 fsdp=1 tensor=1 (2 devices, 2 processes)" in out


def test_the_job_resumes_bitwise(runs: dict) -> None:
    d = cut_copy(runs["two"], runs["tmp"] / "two_again")
    resume(d, 2)
    assert losses(d) == losses(runs["two"])
    for rank_dir in (d, d / "ranks" / "1"):
        assert events(rank_dir, "resumed")[-1]["from_step"] == CUT, rank_dir
        assert events(rank_dir, "run_done"), rank_dir
    assert events(d / "ranks" / "1", "ckpt_committed")[-1]["step"] == STEPS
    from safetensors.numpy import load_file
    a, b = load_file(str(d / "params.safetensors")), load_file(str(runs["two"] / "params.safetensors"))
    assert all(np.array_equal(a[k], b[k]) for k in b)


@pytest.mark.parametrize("saved,procs", [(2, 1), (2, 4), (1, 2)])
def test_resume_on_another_process_count(runs: dict, saved: int, procs: int) -> None:
    ref = runs["two" if saved == 2 else "one"]
    d = cut_copy(ref, runs["tmp"] / f"from{saved}_on{procs}")
    r = resume(d, procs)
    got, whole = losses(d), losses(ref)
    assert sorted(got) == list(range(1, STEPS + 1))
    resumed = events(d, "resumed")[-1]
    assert resumed["from_step"] == CUT
    assert resumed["checkpoint_mesh"] == mesh(saved, saved)
    assert resumed["mesh"] == mesh(procs, procs)
    assert "written on mesh" in r.stderr
    after = np.array([got[s] for s in range(CUT + 1, STEPS + 1)])
    want = np.array([whole[s] for s in range(CUT + 1, STEPS + 1)])
    print(f"saved on {saved} processes, resumed on {procs}: max relative loss difference "
          f"{np.max(np.abs(after - want) / np.abs(want)):.1e}")
    np.testing.assert_allclose(after, want, rtol=1e-5, atol=0)
    # Every rank of the resumed job loaded the checkpoint rank 0 picked.
    for r in range(1, procs):
        assert events(d / "ranks" / str(r), "resumed")[-1]["checkpoint"] == resumed["checkpoint"]
    m = json.loads((d / "checkpoints" / f"step_{STEPS}" / "manifest.json").read_text())
    assert m["mesh"] == mesh(procs, procs)


def test_rank0_killed_mid_save_leaves_the_previous_checkpoint(runs: dict) -> None:
    # The second save (step 6, the last: synchronous) SIGKILLs rank 0 halfway through its first tensor file.
    # mpirun ends the job with the killed rank's status (137) and takes rank 1 down with it.
    d = train(runs["tmp"], "killed", 2, "faults.crash_in_save=2", expect=None)
    ckpts = d / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == [f"step_{CUT}"]
    assert [p.name for p in ckpts.glob(".tmp-step_*")], "the kill left no unfinished write: it did not land mid-save"
    assert (ckpts / "LATEST").read_text().strip() == f"step_{CUT}"
    run([STRATA, "ckpt", "verify", str(d)], 1)
    r = resume(d, 2)
    assert "removed unfinished checkpoint writes" in r.stderr
    assert not list(ckpts.glob(".tmp-*"))
    assert events(d, "resumed")[-1]["from_step"] == CUT
    assert losses(d) == losses(runs["two"])


@pytest.mark.parametrize("on_error,staging", [("stop", "chunked"), ("continue", "full")])
def test_a_failed_save_is_the_same_verdict_on_every_rank(runs: dict, on_error: str, staging: str) -> None:
    # Rank 0's save of step 3 fails (injected ENOSPC); rank 1 learns it in the save's vote (staging=full: a
    # background save, learned at the step-6 save) and applies ckpt.on_error as rank 0 does: both stop with
    # exit 7, or both go on and commit step 6.
    d = train(runs["tmp"], f"ioerr_{on_error}", 2, "faults.io_error_at_save=1", f"ckpt.on_error={on_error}",
              f"ckpt.staging={staging}", expect=7 if on_error == "stop" else 0)
    rank1 = d / "ranks" / "1"
    assert [e["step"] for e in events(rank1, "ckpt_failed")] == [CUT]
    assert "rank 0 failed the checkpoint of step 3" in events(rank1, "ckpt_failed")[0]["error"]
    assert [e["step"] for e in events(d, "ckpt_failed")] == [CUT]
    committed = [] if on_error == "stop" else [STEPS]
    assert [e["step"] for e in events(rank1, "ckpt_committed")] == committed
    assert sorted(p.name for p in (d / "checkpoints").glob("step_*")) == [f"step_{s}" for s in committed]
