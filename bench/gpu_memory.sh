#!/usr/bin/env bash
# bench/gpu_memory.sh — where strata's host memory goes on a lent GPU (issue
# 18; docs/performance.md, "GPU"): gpu.sh's preset trained 3 steps, cold
# with the default ckpt.staging (auto: full there), then warm from that cache
# with ckpt.staging=chunked, and warm with chunked and STRATA_MALLOC_TUNING=0.
# Each run's `memory` events (start and peak, by category), the fit event,
# the peak RSS and the step times go to $OUT/<name>.json.
#
#   bench/gpu_memory.sh [k=v ...]   (k=v appended to the preset; on CPU: a tiny shape)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUTDIR="${OUT:-/tmp/gpu-memory}"
mkdir -p "$OUTDIR"
PY="${STRATA_PYTHON:-$(command -v python3)}"
export STRATA_PYTHON="$PY" STRATA_SOURCE_DIR="$PWD"
PLUGIN="${STRATA_PJRT_PLUGIN:-$("$PY" -c 'import glob, os, jax_plugins
print(next(h for r in jax_plugins.__path__ for h in sorted(glob.glob(os.path.join(r, "**", "xla_cuda_plugin.so"), recursive=True))))')}"
STRATA="${STRATA_BIN:-build-portable/strata}"
SCRATCH=$(mktemp -d)
export STRATA_CACHE_DIR="$SCRATCH/cache"
PRESET=(configs/small.yml model.d_model=2048 model.n_heads=16 model.d_ff=8192 model.n_layers=8 model.seq_len=1024
        train.batch_size=8 train.microbatches=1 model.compute_dtype=bf16 data.synthetic=true train.steps=3
        train.eval_every=0 train.eval_batches=1 "runtime.plugin=$PLUGIN" run.progress=off "$@")
run() {  # name env... -- overrides...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$PY" - "$OUTDIR/$name.json" "$STRATA" train "${PRESET[@]}" "$@" "run.dir=$SCRATCH/$name" <<'PYEOF'
import json, resource, subprocess, sys, time
t0 = time.time()
r = subprocess.run(sys.argv[2:], capture_output=True, text=True)
run_dir = [a for a in sys.argv if a.startswith("run.dir=")][0][8:]
ev = []
try:
    ev = [json.loads(l) for l in open(run_dir + "/events.jsonl", encoding="utf-8")]
except OSError:
    pass
steps = []
try:
    steps = [t for t in (json.loads(l).get("step_time_s") for l in open(run_dir + "/metrics.jsonl", encoding="utf-8")) if t]
except OSError:
    pass
out = {"rc": r.returncode, "wall_s": round(time.time() - t0, 1),
       "maxrss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024,
       "memory": [e for e in ev if e.get("event") == "memory"], "fit": [e for e in ev if e.get("event") in ("fit", "plan")],
       "ckpt": [e for e in ev if e.get("event") == "ckpt_saved"], "step_times_s": steps, "stderr_tail": r.stderr[-600:]}
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(sys.argv[1].rsplit("/", 1)[-1], out["rc"], out["wall_s"], out["maxrss_mib"],
      [(m.get("phase"), m.get("rss_bytes"), m.get("categories")) for m in out["memory"]])
PYEOF
}
run cold-full -- ckpt.staging=auto
run warm-chunked -- ckpt.staging=chunked
run warm-chunked-notuning STRATA_MALLOC_TUNING=0 -- ckpt.staging=chunked
rm -rf "$SCRATCH"
