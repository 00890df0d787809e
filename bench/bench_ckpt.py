"""Checkpoint cost on the tiny preset (issue 5): how long a periodic save
blocks the training thread, against a median step, with ckpt.every at its
default. Target: median blocking time per save < 5% of a median step.

Everything comes from one `strata train configs/tiny.yml` run: metrics.jsonl
has step_time_s per step and ckpt_blocking_s / ckpt_write_s / ckpt_bytes /
ckpt_mb_per_s per save, so the ratio is measured in one process, on one
machine, at one time. Also reported:
  - the final save, which is synchronous (the run waits for the write): the
    cost a save would have without the writer thread;
  - the step right after each periodic save, which runs while the writer
    thread writes: the indirect cost of sharing the CPU with it.

Writes bench/results/bench_ckpt.json and prints a Markdown table.
Usage: python bench/bench_ckpt.py [--steps N] [--strata PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = "configs/tiny.yml"
TARGET = 0.05


def strata_json(strata: str, *args: str) -> dict:
    r = subprocess.run([strata, "config", "--json", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def git_commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() or "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=os.environ.get("STRATA", os.path.join(ROOT, "build", "strata")))
    ap.add_argument("--steps", type=int, default=0, help="steps to run (default: 3 * ckpt.every + 10)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "bench_ckpt.json"))
    a = ap.parse_args()
    if not os.path.exists(a.strata):
        print(f"bench_ckpt: {a.strata} is missing: run `make build` first", file=sys.stderr)
        return 2
    every = strata_json(a.strata, PRESET)["ckpt"]["every"]
    steps = a.steps or 3 * every + 10
    with tempfile.TemporaryDirectory(prefix="strata-bench-ckpt-") as tmp:
        run_dir = os.path.join(tmp, "run")
        cmd = [a.strata, "train", PRESET, f"train.steps={steps}", "run.progress=off", f"run.dir={run_dir}"]
        t0 = time.monotonic()
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if r.returncode != 0:
            print(f"bench_ckpt: {' '.join(cmd)} exited {r.returncode}\n{r.stderr}", file=sys.stderr)
            return 1
        lines = [json.loads(x) for x in open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8")]
    step_time = {m["step"]: m["step_time_s"] for m in lines if "loss" in m}
    saves = [m for m in lines if "ckpt_blocking_s" in m]
    periodic = [s for s in saves if s["step"] != steps]
    final = [s for s in saves if s["step"] == steps]
    if not periodic:
        print(f"bench_ckpt: no periodic save in {steps} steps with ckpt.every={every}", file=sys.stderr)
        return 1
    med_step = statistics.median(step_time.values())
    med_block = statistics.median(s["ckpt_blocking_s"] for s in periodic)
    after = [step_time[s["step"] + 1] for s in periodic if s["step"] + 1 in step_time]
    result = {
        "bench": "ckpt",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git_commit": git_commit(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "preset": PRESET,
        "steps": steps,
        "ckpt_every": every,
        "wall_s": round(wall, 3),
        "median_step_s": med_step,
        "periodic_saves": len(periodic),
        "median_blocking_s": med_block,
        "blocking_ratio": med_block / med_step,
        "target_ratio": TARGET,
        "meets_target": med_block / med_step < TARGET,
        "median_write_s": statistics.median(s["ckpt_write_s"] for s in periodic),
        "bytes_per_save": periodic[0]["ckpt_bytes"],
        "median_mb_per_s": statistics.median(s["ckpt_mb_per_s"] for s in periodic),
        "final_save_blocking_s": final[0]["ckpt_blocking_s"] if final else None,
        "median_step_after_save_s": statistics.median(after) if after else None,
        "saves": periodic + final,
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    ms = lambda s: f"{s * 1e3:.2f} ms" if s is not None else "-"  # noqa: E731
    print(f"### Checkpoint cost, {PRESET}, ckpt.every={every} (default), {steps} steps, {len(periodic)} periodic saves\n")
    print("| measure | value |")
    print("|---|---|")
    print(f"| median step | {ms(med_step)} |")
    print(f"| median blocking time per save (async) | {ms(med_block)} |")
    print(f"| **blocking / step** | **{100 * med_block / med_step:.2f} %** (target < {100 * TARGET:.0f} %: "
          f"{'met' if result['meets_target'] else 'NOT met'}) |")
    print(f"| median write time (writer thread) | {ms(result['median_write_s'])} |")
    print(f"| bytes per save | {result['bytes_per_save'] / 1e6:.2f} MB |")
    print(f"| median write throughput | {result['median_mb_per_s']:.1f} MB/s (fsync included) |")
    print(f"| final save, synchronous (no writer thread) | {ms(result['final_save_blocking_s'])} |")
    print(f"| median step right after a save (shares the CPU with the writer) | {ms(result['median_step_after_save_s'])} |")
    print(f"\nresults: {os.path.relpath(a.out, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
