"""What bench_sched.py and bench_kernels.py share: their command line (a
strata binary, --steps timed after --skip warm-up steps, --reps round-robin
repetitions, --out) and one `strata train` run read back as its step lines.
Not a bench itself (section_extra runs bench_*.py only)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(name: str, doc: str | None) -> argparse.Namespace | None:
    """The bench's arguments; None (after saying why on stderr) when they
    cannot run: the caller exits 2."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=os.environ.get("STRATA", os.path.join(ROOT, "build", "strata")))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the median")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", f"{name}.json"))
    a = ap.parse_args()
    if not os.path.exists(a.strata):
        print(f"{name}: {a.strata} is missing: run `make build` first", file=sys.stderr)
        return None
    if a.steps <= a.skip:
        print(f"{name}: --steps must exceed --skip", file=sys.stderr)
        return None
    return a


def train_steps(strata: str, args: list[str], run_dir: str, env: dict[str, str] | None = None) -> list[dict]:
    """`strata train ARGS run.dir=RUN_DIR` from the repository root: its
    metrics lines that have a loss (the steps). Raises RuntimeError with
    the tail of stderr when it fails."""
    cmd = [strata, "train", *args, f"run.dir={run_dir}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}\n{r.stderr[-2000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [m for m in map(json.loads, f) if "loss" in m]
