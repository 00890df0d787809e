"""What the multi-process checkpoint tests share (test_multiprocess_ckpt.py,
test_multiprocess_shards.py): a tiny 6-step job saving at step 3, run under
mpirun for several processes, and readers of its run directories."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")
MPIRUN = shutil.which("mpirun")
MPI_ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}

STEPS, CUT = 6, 3
OVERRIDES = [
    "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.seq_len=16",
    f"train.steps={STEPS}", "train.batch_size=8", "train.microbatches=2", "train.lr=0.002", "train.warmup_steps=2",
    "train.grad_clip=0.5", "train.eval_every=0", "runtime.deterministic=true", "seed=7", "run.progress=off",
    f"ckpt.every={CUT}", "runtime.cpu_devices=1",
]
# A bound on every job, so that a rank stuck in a collective fails the test instead of hanging it.
TIMEOUT_S = 300


def run(cmd: list[str], procs: int, expect: int | None = 0) -> subprocess.CompletedProcess:
    """Runs |cmd| (under mpirun for several processes); |expect| None: any failure."""
    if procs > 1:
        assert MPIRUN, "mpirun not found: make setup installs openmpi-bin"
        cmd = [MPIRUN, "--oversubscribe", "-np", str(procs), *cmd]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=MPI_ENV, timeout=TIMEOUT_S)
    if (r.returncode == 0) if expect is None else (r.returncode != expect):
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}, expected {expect}\n"
                             f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-5000:]}")
    return r


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def losses(run_dir: Path) -> dict[int, float]:
    """Step -> loss; a step run again after a resume keeps its last value."""
    return {m["step"]: m["loss"] for m in lines(run_dir / "metrics.jsonl") if "loss" in m}


def events(run_dir: Path, name: str) -> list[dict]:
    return [e for e in lines(run_dir / "events.jsonl") if e.get("event") == name]
