"""Scheduling policies on the tiny preset (issue 6): step time and peak live
device bytes of each sched.* policy (and of diag.numerics=step and layer,
issue 15) as ratios to the default plan, all measured in one invocation on
one machine.

The default plan is sched.remat=auto with no memory budget, which on this
preset is remat=none's plan (the remat=none row should read 1); remat=full
was the default before auto and has its own row.

Each policy trains configs/tiny.yml for --steps steps in its own `strata
train` process (one shared bundle and executable cache); the step time of a
run is the median step_time_s after --skip warm-up steps. Policies run
round-robin --reps times so slow drift of the machine hits all of them
alike. Two ratios are reported: "best" divides a policy's fastest timed
step (over all repetitions) by its baseline's fastest — robust when other
work shares the machine, since contention only ever adds time —, "median"
is the median over repetitions of the ratio of median step times within
one repetition. The load average before
and after is recorded with the results. Peak memory is
the accounted peak live device bytes (which equals the plan's prediction;
the bench checks it). sched.optimizer=per_layer needs train.grad_clip=0, so
it is compared with the default plan at grad_clip=0 (the "default, no clip"
row).

On the CPU plugin "device" and "host" memory are the same RAM, so offload
shows its bookkeeping and copy cost but no capacity or bandwidth benefit,
and the overlap ratio measures how much of the copying ran while a launch
was in flight, not PCIe overlap (docs/scheduling.md).

Writes bench/results/bench_sched.json and prints a Markdown table.
Usage: python bench/bench_sched.py [--steps N] [--skip K] [--reps R] [--strata PATH]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from policy_runs import parse_args, train_steps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = "configs/tiny.yml"

# (name, overrides, baseline name)
POLICIES: list[tuple[str, list[str], str]] = [
    ("default", [], "default"),
    ("remat=none", ["sched.remat=none"], "default"),
    ("remat=full", ["sched.remat=full"], "default"),
    ("remat=every:2", ["sched.remat=every:2"], "default"),
    ("wait=eager", ["sched.wait=eager"], "default"),
    ("offload=optimizer prefetch=1", ["sched.offload=optimizer", "sched.prefetch_depth=1"], "default"),
    ("offload=params prefetch=0", ["sched.offload=params", "sched.prefetch_depth=0"], "default"),
    ("offload=params prefetch=1", ["sched.offload=params", "sched.prefetch_depth=1"], "default"),
    ("offload=params prefetch=2", ["sched.offload=params", "sched.prefetch_depth=2"], "default"),
    ("offload=both prefetch=1", ["sched.offload=both", "sched.prefetch_depth=1"], "default"),
    ("default, no clip", ["train.grad_clip=0"], "default, no clip"),
    ("optimizer=per_layer", ["sched.optimizer=per_layer", "train.grad_clip=0"], "default, no clip"),
    ("optimizer=per_layer offload=optimizer",
     ["sched.optimizer=per_layer", "train.grad_clip=0", "sched.offload=optimizer"], "default, no clip"),
    # issue 15: the cost of the statistics (docs/diagnostics.md), against diag.numerics=off (the default)
    ("diag.numerics=step", ["diag.numerics=step"], "default"),
    ("diag.numerics=layer", ["diag.numerics=layer"], "default"),
]


def git_commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() or "?"


def run_policy(strata: str, tmp: str, name: str, overrides: list[str], steps: int, rep: int) -> list[dict]:
    run_dir = os.path.join(tmp, f"{rep}-{name.replace(' ', '_').replace(',', '').replace('=', '-')}")
    return train_steps(strata, [PRESET, f"train.steps={steps}", "train.eval_every=0", "train.eval_batches=1",
                                "run.progress=off", "ckpt.every=0", *overrides], run_dir)


def main() -> int:
    a = parse_args("bench_sched", __doc__)
    if a is None:
        return 2
    t0 = time.monotonic()
    load_before = os.getloadavg()
    per: dict[str, list[dict]] = {name: [] for name, _, _ in POLICIES}
    with tempfile.TemporaryDirectory(prefix="strata-bench-sched-") as tmp:
        # One untimed run first: export and compile land in the caches, not in a policy's numbers.
        run_policy(a.strata, tmp, "warmup", [], a.skip + 1, 0)
        for rep in range(1, a.reps + 1):
            for name, overrides, _ in POLICIES:
                steps = run_policy(a.strata, tmp, name, overrides, a.steps, rep)
                timed = steps[a.skip:]
                per[name].append({
                    "median_step_s": statistics.median(m["step_time_s"] for m in timed),
                    "min_step_s": min(m["step_time_s"] for m in timed),
                    "peak_live_bytes": timed[0]["peak_live_bytes"],
                    "peak_live_bytes_predicted": timed[0]["peak_live_bytes_predicted"],
                    "peak_live_by_category": timed[0]["peak_live_by_category"],
                    "host_bytes": timed[0]["host_bytes"],
                    "h2d_bytes": timed[0]["h2d_bytes"],
                    "d2h_bytes": timed[0]["d2h_bytes"],
                    "launches": timed[0]["launches"],
                    "waits": timed[0]["waits"],
                    "median_wait_s": statistics.median(m["wait_s"] for m in timed),
                    "median_recompute_s": statistics.median(m["recompute_s"] for m in timed),
                    "median_transfer_s": statistics.median(m["transfer_s"] for m in timed),
                    "median_overlap_ratio": statistics.median(
                        m["overlap_ratio"] for m in timed if m["overlap_ratio"] is not None
                    ) if any(m["overlap_ratio"] is not None for m in timed) else None,
                    "max_inflight": max(m["max_inflight"] for m in timed),
                    "accounting_exact": all(m["live_mismatch_op"] == -1
                                            and m["peak_live_bytes"] == m["peak_live_bytes_predicted"] for m in timed),
                })
    rows = []
    for name, overrides, base in POLICIES:
        reps = per[name]
        ratios = [r["median_step_s"] / b["median_step_s"] for r, b in zip(reps, per[base])]
        best = min(r["min_step_s"] for r in reps) / min(b["min_step_s"] for b in per[base])
        r0, b0 = reps[0], per[base][0]
        rows.append({
            "policy": name, "overrides": overrides, "baseline": base,
            "step_time_ratio_best": best,
            "step_time_ratio_median": statistics.median(ratios),
            "step_time_ratio_per_rep": ratios,
            "best_step_s": min(r["min_step_s"] for r in reps),
            "median_step_s": statistics.median(r["median_step_s"] for r in reps),
            "peak_bytes_ratio": r0["peak_live_bytes"] / b0["peak_live_bytes"],
            **{k: r0[k] for k in ("peak_live_bytes", "peak_live_bytes_predicted", "peak_live_by_category",
                                  "host_bytes", "h2d_bytes", "d2h_bytes", "launches", "waits", "max_inflight")},
            "median_wait_s": statistics.median(r["median_wait_s"] for r in reps),
            "median_recompute_s": statistics.median(r["median_recompute_s"] for r in reps),
            "median_transfer_s": statistics.median(r["median_transfer_s"] for r in reps),
            "median_overlap_ratio": r0["median_overlap_ratio"],
            "accounting_exact": all(r["accounting_exact"] for r in reps),
        })
    result = {
        "bench": "sched",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git_commit": git_commit(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "preset": PRESET,
        "steps": a.steps, "skip": a.skip, "reps": a.reps,
        "seconds": round(time.monotonic() - t0, 1),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "note": "CPU plugin: host and device memory are the same RAM; see docs/scheduling.md",
        "policies": rows,
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")

    print(f"## bench_sched: {PRESET}, {a.steps} steps ({a.skip} warm-up) x {a.reps} reps, commit {result['git_commit']}\n")
    print(f"load average {result['load_average_before'][0]} before, {result['load_average_after'][0]} after "
          f"({result['cpus']} CPUs)\n")
    print("| policy | step time vs baseline (best / median of reps) | peak live bytes vs baseline | peak live MB | "
          "host MB | H2D+D2H MB/step | wait ms | recompute ms | overlap | max in flight |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ov = "-" if r["median_overlap_ratio"] is None else f"{r['median_overlap_ratio']:.2f}"
        base = "" if r["baseline"] == "default" else f" (vs {r['baseline']})"
        print(f"| {r['policy']}{base} | {r['step_time_ratio_best']:.3f} / {r['step_time_ratio_median']:.3f} | "
              f"{r['peak_bytes_ratio']:.3f} | "
              f"{r['peak_live_bytes'] / 1e6:.2f} | {r['host_bytes'] / 1e6:.2f} | "
              f"{(r['h2d_bytes'] + r['d2h_bytes']) / 1e6:.2f} | {r['median_wait_s'] * 1e3:.1f} | "
              f"{r['median_recompute_s'] * 1e3:.1f} | {ov} | {r['max_inflight']} |")
    exact = all(r["accounting_exact"] for r in rows)
    print(f"\naccounted peak = predicted peak in every run: {'yes' if exact else 'NO'}; {result['seconds']} s; "
          f"wrote {os.path.relpath(a.out, ROOT)}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
