"""Per-rank checkpoint shards (docs/checkpoints.md, "Per-rank shards";
docs/multiprocess.md, "Checkpoints").

A job with fsdp across its processes (`mpirun -np 2 strata train ...
parallel.fsdp=2 runtime.cpu_devices=1`) holds one block of every
parameter, m and v per rank, so each rank writes its own rows
(rank-<r>.safetensors) and rank 0 commits them with one manifest whose
entries have the layout "rows". Such a checkpoint resumes:

- as the same job: bitwise the uninterrupted run (each rank gets its rows
  back);
- on 1 process (one device), on 2 processes data=2 and on 4 processes x 1
  device data=4, the reader assembling whole tensors from the rows: every
  loss after the resume within rtol 1e-5 of the uninterrupted run;
- after rank 1 alone is SIGKILLed halfway through writing its file (before
  the vote): nobody commits, the previous checkpoint stays the newest valid
  one and LATEST names it, and the job's resume continues bitwise.

Also: `strata ckpt verify` and `inspect` read the layout, and the rows
assemble to the run's whole final parameters. 6 steps of a tiny model,
saves at 3 and 6; cuts copy a run directory and remove its newer
checkpoint (as tests/py/test_multiprocess_ckpt.py does).
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


def cut_copy(src: Path, dst: Path) -> Path:
    """|src| as it was after step CUT: its newer checkpoints removed, LATEST naming step CUT."""
    shutil.copytree(src, dst)
    for ck in (dst / "checkpoints").glob("step_*"):
        if int(ck.name.split("_")[1]) > CUT:
            shutil.rmtree(ck)
    (dst / "checkpoints" / "LATEST").write_text(f"step_{CUT}\n")
    return dst


def resume(d: Path, procs: int, *mesh: str, expect: int | None = 0) -> subprocess.CompletedProcess:
    r = run([STRATA, "resume", str(d), *mesh], procs, expect)
    (d / "resume.stderr").write_text(r.stderr)
    return r


def assembled(ck: Path) -> dict[str, np.ndarray]:
    """Every tensor of a sharded checkpoint, assembled from its rows by the manifest."""
    from safetensors.numpy import load_file
    m = json.loads((ck / "manifest.json").read_text())
    files = {f["file"]: load_file(str(ck / f["file"])) for f in m["files"]}
    pieces: dict[str, list] = {}
    for t in m["tensors"]:
        assert t["layout"] == "rows", t
        pieces.setdefault(t["name"], []).append((t["rows"][0], files[t["file"]][t["name"]]))
    return {k: np.concatenate([a for _, a in sorted(v, key=lambda x: x[0])]) for k, v in pieces.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not os.path.exists(STRATA):
        pytest.skip("build/strata not built")
    tmp = tmp_path_factory.mktemp("shards")
    full = tmp / "full"
    run([STRATA, "train", "configs/test.yml", *OVERRIDES, "parallel.fsdp=2", f"run.dir={full}"], 2)
    out = {"full": full}
    fsdp2 = ["parallel.fsdp=2"]
    for name, procs, mesh in [("same", 2, fsdp2), ("one", 1, ["parallel.fsdp=1"]),
                              ("data2", 2, ["parallel.fsdp=1", "parallel.data=2"]),
                              ("data4", 4, ["parallel.fsdp=1", "parallel.data=4"])]:
        d = cut_copy(full, tmp / name)
        resume(d, procs, *mesh)
        out[name] = d
    # Rank 1 alone killed halfway through its file of the step-6 save: rank
    # 0's drill is marked fired (disarmed) in its own run directory.
    killed = cut_copy(full, tmp / "killed")
    (killed / "diag").mkdir(exist_ok=True)
    (killed / "diag" / "faults.fired").write_text("crash_in_save 1 0 0\n")
    out["killed_run"] = resume(killed, 2, *fsdp2, "faults.crash_in_save=1", expect=None)
    out["killed_ckpts"] = sorted(p.name for p in (killed / "checkpoints").iterdir())
    out["killed_latest"] = (killed / "checkpoints" / "LATEST").read_text()
    out["killed_verify"] = subprocess.run([STRATA, "ckpt", "verify", str(killed)], cwd=ROOT, capture_output=True, text=True,
                                          timeout=TIMEOUT_S)
    resume(killed, 2, *fsdp2)
    out["killed"] = killed
    # Rank 1 alone fails writing its file (injected EIO), ckpt.on_error=continue.
    failed = cut_copy(full, tmp / "failed")
    (failed / "diag").mkdir(exist_ok=True)
    (failed / "diag" / "faults.fired").write_text("io_error_at_save 1 0 0\n")
    resume(failed, 2, *fsdp2, "faults.io_error_at_save=1", "faults.io_error=EIO", "ckpt.on_error=continue")
    out["failed"] = failed
    return out


def test_each_rank_writes_its_rows(runs: dict) -> None:
    full = runs["full"]
    for step in (CUT, STEPS):
        ck = full / "checkpoints" / f"step_{step}"
        assert sorted(p.name for p in ck.iterdir()) == ["manifest.json", "rank-0.safetensors", "rank-1.safetensors"]
        m = json.loads((ck / "manifest.json").read_text())
        assert m["mesh"] == {"data": 1, "fsdp": 2, "tensor": 1, "devices": 2, "processes": 2}
        assert [f["file"] for f in m["files"]] == ["rank-0.safetensors", "rank-1.safetensors"]
        for t in m["tensors"]:
            assert t["layout"] == "rows" and t["file"] in ("rank-0.safetensors", "rank-1.safetensors"), t
            assert t["shape"][0] == t["rows"][1] - t["rows"][0] and t["rows"][1] <= t["dim0"], t
    assert (full / "checkpoints" / "LATEST").read_text() == f"step_{STEPS}\n"
    # rank 1 learns both commits at the vote
    committed = events(full / "ranks" / "1", "ckpt_committed")
    assert [e["step"] for e in committed] == [CUT, STEPS] and all(e["shards"] for e in committed), committed
    assert not (full / "ranks" / "1" / "checkpoints").exists()


def test_rows_assemble_to_the_final_parameters(runs: dict) -> None:
    from safetensors.numpy import load_file
    whole = assembled(runs["full"] / "checkpoints" / f"step_{STEPS}")
    params = load_file(str(runs["full"] / "params.safetensors"))
    assert params and set(params) <= set(whole)
    for name, value in params.items():
        assert whole[name].tobytes() == value.tobytes(), name
    assert any(k.startswith("m:") for k in whole) and any(k.startswith("v:") for k in whole)


def test_ckpt_verify_and_inspect(runs: dict) -> None:
    r = run([STRATA, "ckpt", "verify", str(runs["full"])], 1)
    assert "all 2 checkpoints verified" in r.stdout, r.stdout
    r = run([STRATA, "ckpt", "inspect", str(runs["full"] / "checkpoints" / f"step_{STEPS}")], 1)
    assert "stored in rows, one file per rank" in r.stdout, r.stdout
    assert "wte[0:128 of 256]" in r.stdout and "wte[128:256 of 256]" in r.stdout, r.stdout


def test_resume_same_job_bitwise(runs: dict) -> None:
    full, same = runs["full"], runs["same"]
    assert losses(same) == losses(full)
    for name in ("params.safetensors",):
        assert (same / name).read_bytes() == (full / name).read_bytes()
    a, b = assembled(full / "checkpoints" / f"step_{STEPS}"), assembled(same / "checkpoints" / f"step_{STEPS}")
    assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert events(same, "resumed")[-1]["from_step"] == CUT
    assert events(same / "ranks" / "1", "resumed")[-1]["from_step"] == CUT


@pytest.mark.parametrize("name", ["one", "data2", "data4"])
def test_resume_on_another_mesh(runs: dict, name: str) -> None:
    full, d = losses(runs["full"]), losses(runs[name])
    assert sorted(d) == list(range(1, STEPS + 1))
    for step in range(1, CUT + 1):
        assert d[step] == full[step], step
    np.testing.assert_allclose([d[s] for s in range(CUT + 1, STEPS + 1)],
                               [full[s] for s in range(CUT + 1, STEPS + 1)], rtol=1e-5)
    assert "assembled whole from the ranks' rows" in (runs[name] / "resume.stderr").read_text()
    # Written on the new mesh: whole tensors (one process or data across).
    m = json.loads((runs[name] / "checkpoints" / f"step_{STEPS}" / "manifest.json").read_text())
    assert [f["file"] for f in m["files"]] == ["params.safetensors", "optimizer.safetensors"]


def test_rank_killed_before_the_vote(runs: dict) -> None:
    r = runs["killed_run"]
    assert r.returncode != 0
    assert "FAULT INJECTED" in r.stderr, r.stderr[-3000:]
    # nobody committed step 6: the previous checkpoint is the newest, LATEST names it
    assert f"step_{STEPS}" not in runs["killed_ckpts"], runs["killed_ckpts"]
    assert f"step_{CUT}" in runs["killed_ckpts"] and runs["killed_latest"] == f"step_{CUT}\n"
    assert any(n.startswith(".tmp-step_6") for n in runs["killed_ckpts"]), runs["killed_ckpts"]
    assert runs["killed_verify"].returncode == 0, runs["killed_verify"].stdout
    # the job's resume removes the unfinished write and continues bitwise
    assert losses(runs["killed"]) == losses(runs["full"])
    assert ((runs["killed"] / "params.safetensors").read_bytes() == (runs["full"] / "params.safetensors").read_bytes())


def test_rank_failing_its_write(runs: dict) -> None:
    """A write failing on rank 1 alone: the vote tells every rank, rank 0
    commits nothing and removes the folder, ckpt.on_error applies alike."""
    d = runs["failed"]
    for rank_dir in (d, d / "ranks" / "1"):
        failed = events(rank_dir, "ckpt_failed")
        assert [e["step"] for e in failed] == [STEPS] and all(e["on_error"] == "continue" for e in failed), failed
    assert "rank 1 failed writing its part of the checkpoint of step 6" in events(d, "ckpt_failed")[0]["error"]
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["LATEST", f"step_{CUT}"]
    assert (d / "checkpoints" / "LATEST").read_text() == f"step_{CUT}\n"
    assert losses(d) == losses(runs["full"])
