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
GPU_OUT_DEFAULT=/tmp/gpu-memory GPU_STEPS=3
. "$(dirname "$0")/gpu_env.sh"
export STRATA_CACHE_DIR="$SCRATCH/cache"
run() {  # name env... -- overrides...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$PY" bench/gpu_run.py "$OUTDIR/$name.json" "$STRATA" train "${PRESET[@]}" "$@" "run.dir=$SCRATCH/$name"
}
run cold-full -- ckpt.staging=auto
run warm-chunked -- ckpt.staging=chunked
run warm-chunked-notuning STRATA_MALLOC_TUNING=0 -- ckpt.staging=chunked
rm -rf "$SCRATCH"
