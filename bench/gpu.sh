#!/usr/bin/env bash
# bench/gpu.sh — strata against the monolithic jax.jit anchors on a lent GPU
# machine: a larger preset (~0.5 B parameters) in bf16, step time, start-up /
# compile time, memory, and MFU against a bf16 matmul peak measured there;
# on a machine with 2 or more GPUs also bench/run.py's parallel section
# (parallel.data = 2, 4, 8 as far as the GPUs go, fsdp=2 and tensor=2,
# against the anchor jitted over the same mesh). First run on one H200 on
# 2026-11-30 (docs/performance.md, "GPU"); the parallel section needs 2 or
# more GPUs and is untested there.
#
# The machine (docs/performance.md, "GPU"): jax 0.11.2 and jax-cuda13-pjrt
# installed, the CUDA plugin is xla_cuda_plugin.so inside the jax_plugins
# package, no network, no .venv. This script finds the interpreter and the
# plugin, builds strata if it can (cmake, a C compiler, libyaml, libxxhash,
# libcrypto, libprotobuf-c and protoc-c), then runs bench/gpu_report.py within the time budget. Anything
# missing is reported and the rest still runs (the anchors need only jax).
#
#   bench/gpu.sh [--out DIR] [--budget SECONDS] [--dry-run]
#
#   --out DIR     results folder (default: $OUT when set, else bench/results)
#   --budget S    total seconds, build included (default 450: done well
#                 inside the 8 minutes a lent machine gives one command)
#   --dry-run     on this CPU machine: .venv python, strata's CPU plugin,
#                 configs/test.yml in bf16: checks the plumbing, not speed
#
# Environment: STRATA_PYTHON (interpreter with jax), STRATA_PJRT_PLUGIN (the
# CUDA plugin), STRATA_BIN (a strata binary to use instead of building).
# Exit: 0 all parts ran; 1 some part failed (see the report); 2 usage;
# 4 no usable jax / GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

DRY=0
OUTDIR="${OUT:-bench/results}"
BUDGET=450
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUTDIR="${2:?--out needs a folder}"; shift ;;
    --budget) BUDGET="${2:?--budget needs seconds}"; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "gpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$BUDGET" in ''|*[!0-9]*) echo "gpu.sh: --budget must be whole seconds, got '$BUDGET'" >&2; exit 2 ;; esac

START=$SECONDS
log() { echo "[gpu.sh $((SECONDS - START))s] $*" >&2; }
mkdir -p "$OUTDIR" || exit 2

# --- interpreter ------------------------------------------------------------
if [ "$DRY" = 1 ]; then
  PY="${STRATA_PYTHON:-.venv/bin/python}"
else
  PY="${STRATA_PYTHON:-$(command -v python3 || echo python3)}"
fi
if ! "$PY" -c 'import jax' 2>/dev/null; then
  echo "gpu.sh: '$PY' cannot import jax; set STRATA_PYTHON to an interpreter that can" >&2
  exit 4
fi
log "python: $PY ($("$PY" -c 'import jax; print("jax", jax.__version__)'))"

# --- the accelerator ----------------------------------------------------------
if [ "$DRY" = 0 ]; then
  if ! DEVS=$(timeout 180 "$PY" -c 'import jax; d = jax.devices(); print(d[0].platform, len(d), d[0].device_kind)' 2>&1 | tail -1); then
    echo "gpu.sh: jax found no devices: $DEVS" >&2
    exit 4
  fi
  case "$DEVS" in
    gpu*|cuda*) log "devices: $DEVS" ;;
    *) echo "gpu.sh: jax's default device is not a GPU ($DEVS); use --dry-run on a CPU machine" >&2; exit 4 ;;
  esac
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | sed 's/^/[gpu.sh] nvidia-smi: /' >&2
fi

# --- the CUDA plugin for strata -------------------------------------------------
PLUGIN=""
if [ "$DRY" = 0 ]; then
  PLUGIN="${STRATA_PJRT_PLUGIN:-}"
  if [ -z "$PLUGIN" ]; then
    PLUGIN=$("$PY" - <<'EOF' 2>/dev/null
import glob, os
import jax_plugins
for root in jax_plugins.__path__:
    hits = sorted(glob.glob(os.path.join(root, "**", "xla_cuda_plugin.so"), recursive=True))
    if hits:
        print(hits[0])
        break
EOF
)
  fi
  if [ -n "$PLUGIN" ] && [ -f "$PLUGIN" ]; then
    log "CUDA plugin: $PLUGIN"
  else
    log "no xla_cuda_plugin.so found in jax_plugins (set STRATA_PJRT_PLUGIN): strata will not run, anchors only"
    PLUGIN=""
  fi
fi

# --- strata ---------------------------------------------------------------------
# A binary built elsewhere finds this tree's python/ and configs/ through
# STRATA_SOURCE_DIR, not through the path it was built in.
export STRATA_SOURCE_DIR="$PWD"
works() { [ -x "$1" ] && "$1" config --schema >/dev/null 2>&1; }
STRATA=""
if [ -n "${STRATA_BIN:-}" ] && works "$STRATA_BIN"; then
  STRATA="$STRATA_BIN"
elif [ "$DRY" = 1 ] && works build/strata; then
  STRATA=build/strata
elif [ "$DRY" = 0 ] && [ -n "$PLUGIN" ] && works build-portable/strata; then
  STRATA=build-portable/strata  # `make build-portable` here, carried: needs only glibc there
elif [ "$DRY" = 0 ] && [ -n "$PLUGIN" ]; then
  if command -v cmake >/dev/null && command -v cc >/dev/null; then
    log "building strata in build-gpu/"
    if timeout 200 cmake -S . -B build-gpu -DSTRATA_TESTS=OFF >"$OUTDIR/gpu-build.log" 2>&1 &&
       timeout 200 cmake --build build-gpu -j "$(nproc 2>/dev/null || echo 4)" >>"$OUTDIR/gpu-build.log" 2>&1 &&
       works build-gpu/strata; then
      STRATA=build-gpu/strata
    else
      log "build failed (tail of $OUTDIR/gpu-build.log follows); anchors only"
      tail -15 "$OUTDIR/gpu-build.log" >&2
    fi
  elif works build/strata; then
    STRATA=build/strata  # carried from elsewhere; its libraries happen to be here
  else
    log "no cmake / C compiler and no working build/strata: anchors only"
  fi
fi
[ -n "$STRATA" ] && log "strata: $STRATA"

# --- the measurements -------------------------------------------------------------
LEFT=$((BUDGET - (SECONDS - START)))
if [ "$LEFT" -lt 60 ]; then
  echo "gpu.sh: only ${LEFT}s of the budget left after setup; nothing measured" >&2
  exit 1
fi
ARGS=(--out "$OUTDIR" --strata "$STRATA" --plugin "$PLUGIN" --budget-s "$LEFT")
[ "$DRY" = 1 ] && ARGS+=(--dry-run)
export STRATA_PYTHON="$PY"
log "running bench/gpu_report.py (${LEFT}s left)"
timeout $((LEFT + 30)) "$PY" bench/gpu_report.py "${ARGS[@]}"
rc=$?
log "done (exit $rc); results in $OUTDIR"
exit $rc
