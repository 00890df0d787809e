# bench/gpu_env.sh — sourced by the GPU probes (gpu_probe.sh, gpu_memory.sh):
# the interpreter, the CUDA plugin, the strata binary, a scratch folder and
# gpu.sh's preset (~0.5 B parameters, bf16, synthetic data). Before sourcing,
# set GPU_OUT_DEFAULT (results folder when $OUT is unset) and GPU_STEPS; the
# script's own arguments (k=v) are appended to the preset.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
OUTDIR="${OUT:-$GPU_OUT_DEFAULT}"
mkdir -p "$OUTDIR"
PY="${STRATA_PYTHON:-$(command -v python3)}"
export STRATA_PYTHON="$PY" STRATA_SOURCE_DIR="$PWD"
PLUGIN="${STRATA_PJRT_PLUGIN:-$("$PY" -c 'import glob, os, jax_plugins
print(next(h for r in jax_plugins.__path__ for h in sorted(glob.glob(os.path.join(r, "**", "xla_cuda_plugin.so"), recursive=True))))')}"
STRATA="${STRATA_BIN:-build-portable/strata}"
SCRATCH=$(mktemp -d)
PRESET=(configs/small.yml model.d_model=2048 model.n_heads=16 model.d_ff=8192 model.n_layers=8 model.seq_len=1024
        train.batch_size=8 train.microbatches=1 model.compute_dtype=bf16 data.synthetic=true "train.steps=$GPU_STEPS"
        train.eval_every=0 train.eval_batches=1 "runtime.plugin=$PLUGIN" run.progress=off "$@")
