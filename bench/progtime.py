"""Device time of each program of strata's step plan, one program at a time.

    python bench/progtime.py CONFIG [k=v ...] --out FILE.json [--plugin PATH --cpu-devices N] [--reps N]

Reads the step plan (`strata plan --json`: which programs, how many launches
of each per step) and the bundle manifest (input shapes), compiles every
program of the plan with the same XLA client strata uses (strata's PJRT
plugin loaded into JAX; jaxlib's own CPU client without --plugin), and times
each one alone: inputs on the device and ready, then launch to outputs
ready, median of --reps runs. The sum over the plan, launches times median,
is what one step would cost with no gap at all between launches: set
against strata's measured step time it separates the cost of the programs
themselves (decomposition, recomputation, lost fusion) from the cost of
running them one after another (dispatch, idle workers). Inputs are random
(normal * 0.02; token ids below the vocabulary): timing only, never values.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The programs run on a jax client (jaxlib's, or the plugin through jax),
# which has none of strata's FFI handlers: every kernel op at xla (the
# default, kernels.<op>=auto, is ffi on a CPU plugin). First, so that an
# explicit override still wins (and then fails to compile, saying why).
KERNELS_XLA = [f"kernels.{op}=xla" for op in ("rmsnorm", "swiglu", "cross_entropy", "attention")]


def plan_launches(strata: str, config: str, overrides: list[str]) -> tuple[str, dict[str, int]]:
    r = subprocess.run([strata, "plan", "--json", config, *KERNELS_XLA, *overrides], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"strata plan failed: {r.stderr.strip()}")
    plan = json.loads(r.stdout)
    # LAUNCH and RECOMPUTE (a forward run again inside the backward pass) both run a program.
    counts = collections.Counter(o["program"] for o in plan["step"]["ops"] if o.get("program"))
    return plan["bundle"], dict(counts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--out", required=True)
    ap.add_argument("--strata", default=os.environ.get("STRATA_BIN", os.path.join(ROOT, "build", "strata")))
    ap.add_argument("--plugin", default="")
    ap.add_argument("--cpu-devices", type=int, default=0)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args(argv)
    bundle, counts = plan_launches(a.strata, a.config, a.overrides)

    sys.path.insert(0, os.path.join(ROOT, "python"))
    import jax
    import numpy as np
    from jax._src.lib import xla_client as xc  # compile_and_load of MLIR text: no public API

    from strata_jax.anchor import plugin_device

    dev = plugin_device(a.plugin, a.cpu_devices) if a.plugin else jax.devices()[0]
    client = dev.client
    with open(os.path.join(bundle, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    progs = {p["name"]: p for p in manifest["programs"]}
    vocab = int(manifest["model"]["vocab_size"])
    rng = np.random.default_rng(0)
    np_dtype = {"f32": np.float32, "s32": np.int32, "u32": np.uint32, "f16": np.float16}

    def host_input(spec: dict[str, Any]) -> Any:
        shape = tuple(spec["shape"])
        if spec["dtype"] in ("s32", "u32"):
            return rng.integers(0, vocab, size=shape).astype(np_dtype[spec["dtype"]])
        if spec["dtype"] == "bf16":
            return jax.numpy.asarray(rng.standard_normal(shape) * 0.02, jax.numpy.bfloat16)
        return (rng.standard_normal(shape) * 0.02).astype(np_dtype.get(spec["dtype"], np.float32))

    rows = []
    for name, n in sorted(counts.items()):
        p = progs[name]
        with open(os.path.join(bundle, p["file"]), encoding="utf-8") as f:
            text = f.read()
        t0 = time.perf_counter()
        exe = client.compile_and_load(text, client.devices()[:1] if not a.plugin else [dev], xc.CompileOptions())
        compile_s = time.perf_counter() - t0
        host = [host_input(s) for s in p["inputs"]]
        times = []
        for _ in range(a.reps + 1):  # the first run is a warm-up
            bufs = [jax.device_put(h, dev) for h in host]  # fresh: donated inputs are consumed
            jax.block_until_ready(bufs)
            t0 = time.perf_counter()
            jax.block_until_ready(exe.execute(bufs))
            times.append(time.perf_counter() - t0)
        med = float(np.median(times[1:]))
        rows.append({"program": name, "launches_per_step": n, "median_s": med, "per_step_s": med * n,
                     "compile_s": compile_s, "flops": p.get("flops")})
    total = sum(r["per_step_s"] for r in rows)
    out = {"config": a.config, "overrides": a.overrides, "bundle": bundle, "client": a.plugin or "jaxlib",
           "device": str(dev), "programs": rows, "sum_per_step_s": total,
           "launches_per_step": sum(counts.values())}
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
