"""Kernels on the hot path (issue 14; docs/kernels.md, "Speed"): the step time
of configs/small.yml with every kernel op at ffi (strata's C kernels) as a
ratio to every op at xla, in one invocation on one machine, and the per-call
ratios of `strata kernels bench` on the contract's bench shapes.

Two shapes of the small preset: as shipped (byte vocabulary: attention and
the norms are what the kernels change) and with model.vocab_size=32768
(the vocabulary cross-entropy dominates the head). Synthetic data in both,
so the token source costs the same. Each variant trains in its own `strata
train` process, round-robin --reps times; "best" divides the fastest timed
step by the baseline's fastest (contention only adds time), "median" is the
median over repetitions of the ratio of median step times. The final
losses of the two runs of a repetition are printed beside: the kernels
change rounding only.

The ffi kernels exist for the CPU plugin only (docs/kernels.md, "What runs
where"); on a GPU this section does not apply.

Writes bench/results/bench_kernels.json and prints Markdown.
Usage: python bench/bench_kernels.py [--steps N] [--skip K] [--reps R] [--strata PATH]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from policy_runs import parse_args, train_steps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = "configs/small.yml"
OPS = ("rmsnorm", "swiglu", "attention", "cross_entropy")
SHAPES: dict[str, list[str]] = {"small": [], "small, vocab 32768": ["model.vocab_size=32768"]}
# Both explicit: the default (kernels.<op>=auto) is ffi on the CPU plugin.
IMPLS: dict[str, list[str]] = {impl: [f"kernels.{op}={impl}" for op in OPS] for impl in ("xla", "ffi")}


def train(strata: str, tmp: str, tag: str, overrides: list[str], steps: int) -> list[dict]:
    return train_steps(strata, [PRESET, "data.synthetic=true", f"train.steps={steps}", "train.eval_every=0",
                                "train.eval_batches=1", "ckpt.every=0", "run.progress=off", "obs.tensorboard=false",
                                *overrides], os.path.join(tmp, tag),
                       env={**os.environ, "STRATA_CACHE_DIR": os.path.join(tmp, "cache")})


def main() -> int:
    a = parse_args("bench_kernels", __doc__)
    if a is None:
        return 2
    t0 = time.monotonic()
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="strata-bench-kernels-") as tmp:
        for shape, shape_over in SHAPES.items():
            per: dict[str, list[dict]] = {impl: [] for impl in IMPLS}
            for impl, over in IMPLS.items():  # untimed: export and compile land in the cache
                train(a.strata, tmp, f"warm-{len(rows)}-{impl}", shape_over + over, a.skip + 1)
            for rep in range(a.reps):
                for impl, over in IMPLS.items():
                    steps = train(a.strata, tmp, f"{len(rows)}-{impl}-{rep}", shape_over + over, a.steps)
                    t = [m["step_time_s"] for m in steps[a.skip:]]
                    per[impl].append({"median_s": statistics.median(t), "min_s": min(t),
                                      "final_loss": steps[-1]["loss"]})
            x, f = per["xla"], per["ffi"]
            rows.append({
                "shape": shape, "overrides": shape_over,
                "xla_median_s": statistics.median(r["median_s"] for r in x),
                "ffi_median_s": statistics.median(r["median_s"] for r in f),
                "ratio_best": min(r["min_s"] for r in f) / min(r["min_s"] for r in x),
                "ratio_median": statistics.median(b["median_s"] / c["median_s"] for b, c in zip(f, x)),
                "final_loss_rel_diff": max(abs(b["final_loss"] - c["final_loss"]) / abs(c["final_loss"])
                                           for b, c in zip(f, x)),
            })
    kb = subprocess.run([a.strata, "kernels", "bench", "--runs", "5"], cwd=ROOT, capture_output=True, text=True)
    result = {"bench": "kernels", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "preset": PRESET,
              "steps": a.steps, "skip": a.skip, "reps": a.reps, "cpus": os.cpu_count(),
              "seconds": round(time.monotonic() - t0, 1),
              "load_average_before": [round(v, 2) for v in load_before],
              "load_average_after": [round(v, 2) for v in os.getloadavg()],
              "steps_ffi_vs_xla": rows, "kernels_bench_rc": kb.returncode, "kernels_bench": kb.stdout}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")

    print(f"## bench_kernels: {PRESET}, every op at ffi against every op at xla, {a.steps} steps "
          f"({a.skip} warm-up) x {a.reps} reps\n")
    print(f"load average {result['load_average_before'][0]} before, {result['load_average_after'][0]} after "
          f"({result['cpus']} CPUs)\n")
    print("| shape | xla median step | ffi median step | ffi / xla (best / median of reps) | final loss rel. diff |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['xla_median_s'] * 1e3:.0f} ms | {r['ffi_median_s'] * 1e3:.0f} ms | "
              f"{r['ratio_best']:.3f} / {r['ratio_median']:.3f} | {r['final_loss_rel_diff']:.1e} |")
    print(f"\nPer call (`strata kernels bench --runs 5`, exit {kb.returncode}):\n")
    print("```\n" + (kb.stdout.strip() or kb.stderr.strip()[-1500:]) + "\n```")
    print(f"\n{result['seconds']} s; wrote {os.path.relpath(a.out, ROOT)}")
    return 0 if kb.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
