#!/usr/bin/env bash
# bench/gpu_probe.sh — where strata's cold start and host memory go on a lent
# GPU (docs/performance.md, "GPU"): gpu.sh's preset trained 10 steps three
# times, each with its peak RSS, start-up and compile seconds: a cold start
# compiling one program at a time (runtime.compile_threads=1), a warm start
# from that cache, and a cold start at the default thread count.
#
#   bench/gpu_probe.sh [k=v ...]   results in $OUT (default /tmp/gpu-probe);
#                                  k=v are appended to the preset (a CPU check: a tiny shape)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUTDIR="${OUT:-/tmp/gpu-probe}"
mkdir -p "$OUTDIR"
PY="${STRATA_PYTHON:-$(command -v python3)}"
export STRATA_PYTHON="$PY" STRATA_SOURCE_DIR="$PWD"
PLUGIN="${STRATA_PJRT_PLUGIN:-$("$PY" -c 'import glob, os, jax_plugins
print(next(h for r in jax_plugins.__path__ for h in sorted(glob.glob(os.path.join(r, "**", "xla_cuda_plugin.so"), recursive=True))))')}"
STRATA="${STRATA_BIN:-build-portable/strata}"
SCRATCH=$(mktemp -d)
PRESET=(configs/small.yml model.d_model=2048 model.n_heads=16 model.d_ff=8192 model.n_layers=8 model.seq_len=1024
        train.batch_size=8 train.microbatches=1 model.compute_dtype=bf16 data.synthetic=true train.steps=10
        train.eval_every=0 train.eval_batches=1 "runtime.plugin=$PLUGIN" run.progress=off "$@")
probe() {  # name cache-folder overrides...
  local name=$1 cache=$2; shift 2
  STRATA_CACHE_DIR="$SCRATCH/$cache" "$PY" - "$OUTDIR/$name.json" "$STRATA" train "${PRESET[@]}" "$@" \
    "run.dir=$SCRATCH/$name" <<'PYEOF'
import json, resource, subprocess, sys, time
t0 = time.time()
r = subprocess.run(sys.argv[2:], capture_output=True, text=True)
run_dir = [a for a in sys.argv if a.startswith("run.dir=")][0][8:]
ev = {}
try:
    for line in open(run_dir + "/events.jsonl", encoding="utf-8"):
        e = json.loads(line)
        ev.setdefault(e.get("event"), e)
except OSError:
    pass
steps = []
try:
    steps = [t for t in (json.loads(l).get("step_time_s") for l in open(run_dir + "/metrics.jsonl", encoding="utf-8")) if t]
except OSError:
    pass
out = {"rc": r.returncode, "wall_s": round(time.time() - t0, 1),
       "maxrss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024,
       "startup_s": ev.get("run", {}).get("startup_seconds"), "compile_s": ev.get("compile", {}).get("seconds"),
       "compile_threads": ev.get("compile", {}).get("threads"), "cache_hits": ev.get("compile", {}).get("cache_hits"),
       "step_times_s": steps[-5:], "stderr_tail": r.stderr[-600:]}
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(sys.argv[1].rsplit("/", 1)[-1], {k: v for k, v in out.items() if k != "stderr_tail"})
PYEOF
}
probe cold-1thread one runtime.compile_threads=1
probe warm-1thread one runtime.compile_threads=1
probe cold-default two
rm -rf "$SCRATCH"
