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
GPU_OUT_DEFAULT=/tmp/gpu-probe GPU_STEPS=10
. "$(dirname "$0")/gpu_env.sh"
probe() {  # name cache-folder overrides...
  local name=$1 cache=$2; shift 2
  STRATA_CACHE_DIR="$SCRATCH/$cache" "$PY" bench/gpu_run.py "$OUTDIR/$name.json" "$STRATA" train "${PRESET[@]}" "$@" \
    "run.dir=$SCRATCH/$name"
}
probe cold-1thread one runtime.compile_threads=1
probe warm-1thread one runtime.compile_threads=1
probe cold-default two
rm -rf "$SCRATCH"
