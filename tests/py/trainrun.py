"""What the one-process equivalence tests share (test_data_parallel.py,
test_pipeline.py): running strata with its output kept for the failure
message, and one training's metrics and events read back."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    """|cmd| from the repository root; its stdout and stderr in the error when it fails."""
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


def train(run_dir: Path, config: str, *args: str) -> dict:
    """strata train |config| |args| into |run_dir|: its step and evaluation
    metrics lines and its events."""
    run([STRATA, "train", config, *args, f"run.dir={run_dir}"])
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return {"dir": run_dir, "steps": [m for m in lines if "loss" in m],
            "evals": [m for m in lines if "eval_loss" in m], "events": events}
