#!/usr/bin/env bash
# test_kernels.sh — `strata kernels list|verify` and the bundle's kernels
# (docs/kernels.md): the contract printed, every implementation verified
# against the reference (exit 4 naming op, implementation, shape and error
# when outside tolerance), a run with ffi kernels, and a bundle whose
# kernels this strata does not register (another contract version, an
# unknown target) refused with exit 4 before any compile; kernels.<op>=auto
# (the default) resolved per platform. The training
# equivalence of the implementations is tests/py/test_kernels_train.py.
# Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d /tmp/strata-e2e-kernels-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# The cache of the whole make test when run_all.sh shares one (tests/README.md, "Time"); alone, a private one.
[ "${STRATA_E2E_SHARED_CACHE:-0}" = 1 ] || export STRATA_CACHE_DIR="$TMP/cache"

source "$(dirname "$0")/lib.sh"

# --- list -----------------------------------------------------------------------
expect_exit 0 "^rmsnorm v1 " kernels list
check "list names the ops' FFI targets and tolerances" \
  "grep -q 'strata_swiglu_bwd_v1' '$TMP/out' && grep -q 'strata_cross_entropy_fwd_v1' '$TMP/out' && grep -q 'tolerance     f32 fwd rtol 1e-05' '$TMP/out' && grep -q 'strata_attention_bwd_v1' '$TMP/out'"
expect_exit 0 '"contract_version"' kernels list --json
check "list --json parses, with every op" \
  "$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); assert [o[\"name\"] for o in d[\"ops\"]]==[\"rmsnorm\",\"swiglu\",\"cross_entropy\",\"attention\"]' '$TMP/out'"
expect_exit 2 "unknown subcommand" kernels frobnicate

# --- verify ---------------------------------------------------------------------
# Every op's ffi kernel on every contract shape; pallas (interpret mode, slow)
# through the command for one op here, every op's pallas kernel against the
# reference in tests/py/test_kernels.py.
expect_exit 0 "36 cases within tolerance \(36 through FFI handlers\)" kernels verify --impl ffi
check "verify prints a line per case, fwd and bwd" "grep -Eq '^rmsnorm +ffi +bwd f32\[2,33,257\] .* ok$' '$TMP/out'"
check "verify covers the cross-entropy at vocab 256 and 50304" \
  "grep -Eq '^cross_entropy +ffi +bwd f32\[5,256\] .* ok$' '$TMP/out' && grep -Eq '^cross_entropy +ffi +bwd f32\[3,50304\] .* ok$' '$TMP/out'"
check "verify runs attention's GQA and head-dim-128 cases" \
  "grep -Eq '^attention +ffi +bwd f32\[2,33,4,8\] .* ok$' '$TMP/out' && grep -Eq '^attention +ffi +fwd f32\[1,70,2,128\] .* ok$' '$TMP/out'"
check "verify runs attention's seg form (segment_ids) through its own targets" \
  "grep -Eq '^attention +ffi +bwd f32\[2,33,4,8\] seg .* ok$' '$TMP/out' && grep -Eq '^attention +ffi +fwd f32\[1,70,2,128\] seg .* ok$' '$TMP/out'"
expect_exit 0 "[0-9]+ cases within tolerance" kernels verify --op swiglu
check "verify runs ffi and pallas when no --impl is given" \
  "grep -Eq '^swiglu +pallas +fwd f32\[3,5,1001\] .* ok$' '$TMP/out' && grep -Eq '^swiglu +ffi +fwd f32\[3,5,1001\] .* ok$' '$TMP/out'"
expect_exit 2 "no such kernel op" kernels verify --op conv2d
# --op with --impl: one op's ffi cases only (attention's ffi cases ran in the
# whole verify above; rmsnorm's are the quickest to run again).
expect_exit 0 "8 cases within tolerance \(8 through FFI handlers\)" kernels verify --op rmsnorm --impl ffi
check "--impl ffi leaves pallas out" "! grep -q pallas '$TMP/out'"
expect_exit 2 "--impl 'xla' is not ffi or pallas" kernels verify --impl xla
expect_exit 4 "kernel 'swiglu', implementation (ffi|pallas), (fwd|bwd), shape f32\[[0-9,]+\]: largest error [0-9.e-]+" \
  kernels verify --op swiglu --tolerance-scale 0
# make test benches one op; every op's bench (attention at seq 1024 among
# them) is the long drill (STRATA_TEST_FULL=1, make test-long).
if [ -n "${STRATA_TEST_FULL:-}" ]; then
  expect_exit 0 "^swiglu +bwd f32\[8,256,4096\] +ffi +[0-9.]+ us +[0-9.]+x xla$" kernels bench --runs 2
  check "bench times attention at seq 256 and 1024" \
    "grep -Eq '^attention bwd f32\[4,256,8,64\] +ffi ' '$TMP/out' && grep -Eq '^attention fwd f32\[2,1024,8,64\] +ffi ' '$TMP/out'"
else
  expect_exit 0 "^swiglu +bwd f32\[8,256,4096\] +ffi +[0-9.]+ us +[0-9.]+x xla$" kernels bench --op swiglu --runs 2
  check "bench --op times that op only" "! grep -q '^attention' '$TMP/out'"
fi
check "bench does not time pallas (interpret mode)" "! grep -q pallas '$TMP/out'"
# The portable C path (what a CPU without AVX-512 runs), forced, for every
# op's ffi kernel: a tolerance met only by the AVX-512 code would show here.
# make test forces it for one op; every op is the long drill (make test-long,
# which also reruns the numeric pytest files with STRATA_KERNELS_ISA=portable).
if [ -n "${STRATA_TEST_FULL:-}" ]; then
  STRATA_KERNELS_ISA=portable "$STRATA" kernels verify --impl ffi >"$TMP/out" 2>&1
  check "verify with the portable path forced: every op's ffi kernel" \
    "grep -q 'C kernels use portable' '$TMP/out' && grep -Eq '^kernels verify: 36 cases within tolerance \(36 through FFI handlers\)' '$TMP/out'"
else
  STRATA_KERNELS_ISA=portable "$STRATA" kernels verify --op rmsnorm --impl ffi >"$TMP/out" 2>&1
  check "verify with the portable path forced: rmsnorm's ffi kernel" \
    "grep -q 'C kernels use portable' '$TMP/out' && grep -Eq '^kernels verify: 8 cases within tolerance \(8 through FFI handlers\)' '$TMP/out'"
fi

# --- a run with ffi kernels, and bundles this strata cannot serve ---------------
RUN=(configs/test.yml run.progress=off train.steps=2 train.eval_every=0 ckpt.every=0 kernels.rmsnorm=ffi kernels.swiglu=ffi
     kernels.cross_entropy=ffi kernels.attention=ffi)
"$STRATA" export "${RUN[@]}" bundle.dir="$TMP/b" >/dev/null 2>"$TMP/err" && ok || bad "export with ffi kernels: $(tail -2 "$TMP/err")"
check "the manifest records each op's implementation and targets" \
  "$PY -c 'import json,sys; k=json.load(open(sys.argv[1]))[\"kernels\"]; assert k[\"ops\"][0][\"impl\"]==\"ffi\" and k[\"ops\"][0][\"targets\"]==[\"strata_rmsnorm_fwd_v1\",\"strata_rmsnorm_bwd_v1\"], k' '$TMP/b/manifest.json'"
check "the programs call the targets" "grep -q 'custom_call @strata_swiglu_bwd_v1' '$TMP/b/programs/block_bwd_res.mlir'"
check "the residual path calls attention's targets" \
  "grep -q 'custom_call @strata_attention_fwd_v1' '$TMP/b/programs/block_fwd_res.mlir' && grep -q 'custom_call @strata_attention_bwd_v1' '$TMP/b/programs/block_bwd_res.mlir'"
check "the head's loss calls the cross-entropy targets" \
  "grep -q 'custom_call @strata_cross_entropy_fwd_v1' '$TMP/b/programs/head_loss.mlir' && grep -q 'custom_call @strata_cross_entropy_bwd_v1' '$TMP/b/programs/head_loss.mlir'"
if "$STRATA" train "${RUN[@]}" bundle.dir="$TMP/b" run.dir="$TMP/r1" 'trace.steps=[2]' >/dev/null 2>"$TMP/err"; then ok; else bad "train with ffi kernels: $(tail -2 "$TMP/err")"; fi
# Per-kernel observability: with trace.steps on, every step's metrics line
# has calls and time of each ffi kernel, and the traced step's trace has a
# slice per call, named by the kernel.
check "trace.steps: every step's metrics count calls and time of each ffi kernel" \
  "$PY -c '
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if \"loss\" in r]
assert len(rows) == 2, rows
for r in rows:
    k = r[\"kernels\"]
    for op in (\"rmsnorm\", \"swiglu\", \"cross_entropy\", \"attention\"):
        for d in (\"fwd\", \"bwd\"):
            assert k[op + \".\" + d][\"calls\"] > 0 and k[op + \".\" + d][\"time_s\"] >= 0, (op, d, k)
' '$TMP/r1/metrics.jsonl'"
check "trace.steps: the trace names each ffi kernel's calls" \
  "$PY -c '
import json, sys
t = json.load(open(sys.argv[1]))
names = {e[\"name\"] for e in t[\"traceEvents\"] if e.get(\"cat\") == \"kernel\"}
want = {\"kernel.%s %s\" % (o, d) for o in (\"rmsnorm\", \"swiglu\", \"cross_entropy\", \"attention\") for d in (\"fwd\", \"bwd\")}
assert names == want, names
' '$TMP/r1/trace/step_2.json'"
"$STRATA" train configs/test.yml run.progress=off train.steps=2 train.eval_every=0 ckpt.every=0 'trace.steps=[2]' \
  run.dir="$TMP/rx" >/dev/null 2>"$TMP/err" && ok || bad "train with xla kernels: $(tail -2 "$TMP/err")"
check "with every kernel at xla: no kernels in the metrics, none in the trace" \
  "! grep -q '\"kernels\"' '$TMP/rx/metrics.jsonl' && ! grep -q '\"cat\": *\"kernel\"' '$TMP/rx/trace/step_2.json' && grep -q '\"cat\"' '$TMP/rx/trace/step_2.json'"
check "context.json records the kernels and the ISA" \
  "$PY -c 'import json,sys; k=json.load(open(sys.argv[1]))[\"kernels\"]; assert k[\"rmsnorm\"]==\"ffi\" and k[\"isa\"] in (\"avx512\",\"portable\"), k' '$TMP/r1/context.json'"
# plan --compile compiles the bundle's programs: it registers the handlers
# too (before, "No FFI handler registered for strata_rmsnorm_fwd_v1").
expect_exit 0 "temporaries per program" plan --compile "${RUN[@]}" bundle.dir="$TMP/b"
# eval and sample open the same bundle and register the handlers too
expect_exit 0 "perplexity" eval "$TMP/r1" bundle.dir="$TMP/b"
expect_exit 0 "^1 2( [0-9]+){3}$" sample "$TMP/r1" --prompt "1 2" --tokens 3
check "config.yaml records the selection" "grep -A2 '^kernels:' '$TMP/r1/config.yaml' | grep -Eq 'rmsnorm: \"?ffi'"

# --- kernels.<op>=auto (the default): the fastest verified on the platform -------
# configs/test.yml pins every op at xla; these runs set auto back. On the CPU
# plugin auto is ffi (docs/kernels.md, "Selection").
AUTO=(configs/test.yml run.progress=off train.steps=2 train.eval_every=0 ckpt.every=0 kernels.rmsnorm=auto
      kernels.swiglu=auto kernels.cross_entropy=auto kernels.attention=auto)
"$STRATA" train "${AUTO[@]}" run.dir="$TMP/ra" >/dev/null 2>"$TMP/err" && ok || bad "train with auto kernels: $(tail -2 "$TMP/err")"
check "auto on the CPU plugin: the bundle event shows ffi for every op, and how auto was resolved" \
  "$PY -c '
import json, sys
ev = [e for e in map(json.loads, open(sys.argv[1])) if e.get(\"event\") == \"bundle\"][0]
k, sel = ev[\"kernels\"], ev[\"kernel_selection\"]
assert all(k[o] == \"ffi\" for o in (\"rmsnorm\", \"swiglu\", \"cross_entropy\", \"attention\")), k
assert sel[\"platform\"] == \"cpu\" and sorted(sel[\"auto\"]) == [\"attention\", \"cross_entropy\", \"rmsnorm\", \"swiglu\"], sel
' '$TMP/ra/events.jsonl'"
check "auto: context.json records the resolved implementations, config.yaml keeps auto" \
  "$PY -c 'import json,sys; k=json.load(open(sys.argv[1]))[\"kernels\"]; assert k[\"attention\"]==\"ffi\" and k[\"swiglu\"]==\"ffi\", k' '$TMP/ra/context.json' && grep -A2 '^kernels:' '$TMP/ra/config.yaml' | grep -Eq 'rmsnorm: \"?auto'"
"$STRATA" train "${AUTO[@]}" kernels.swiglu=xla run.dir="$TMP/rb" >/dev/null 2>"$TMP/err" && ok || bad "train with auto and swiglu=xla: $(tail -2 "$TMP/err")"
check "an explicit kernels.<op> wins over auto" \
  "$PY -c '
import json, sys
ev = [e for e in map(json.loads, open(sys.argv[1])) if e.get(\"event\") == \"bundle\"][0]
k, sel = ev[\"kernels\"], ev[\"kernel_selection\"]
assert k[\"swiglu\"] == \"xla\" and k[\"rmsnorm\"] == k[\"attention\"] == k[\"cross_entropy\"] == \"ffi\", k
assert \"swiglu\" not in sel[\"auto\"], sel
' '$TMP/rb/events.jsonl'"
# make run's config (configs/tiny.yml, no kernels keys): ffi on the CPU plugin.
"$STRATA" export configs/tiny.yml bundle.dir="$TMP/bt" >/dev/null 2>"$TMP/err" && ok || bad "export tiny: $(tail -2 "$TMP/err")"
check "configs/tiny.yml exports with every op at ffi, and export says what it assumed" \
  "$PY -c 'import json,sys; ops=json.load(open(sys.argv[1]))[\"kernels\"][\"ops\"]; assert all(o[\"impl\"]==\"ffi\" for o in ops), ops' '$TMP/bt/manifest.json' && grep -q 'kernels: auto resolved for platform cpu' '$TMP/err'"
# A plugin whose file name says another platform (the CPU plugin under a
# CUDA plugin's name: a stand-in, no GPU here): export, which has no runtime,
# resolves auto to xla for it and says so; train finds the runtime's
# platform is cpu, where auto means ffi, and refuses (exit 4) naming the fix.
CPU_PLUGIN=$(ls .venv/lib/python3*/site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so 2>/dev/null | tail -1)
mkdir -p "$TMP/plug" && ln -s "$(realpath "$CPU_PLUGIN")" "$TMP/plug/pjrt_c_api_cuda_plugin.so"
"$STRATA" export "${AUTO[@]}" runtime.plugin="$TMP/plug/pjrt_c_api_cuda_plugin.so" bundle.dir="$TMP/bc" >/dev/null 2>"$TMP/err" \
  && ok || bad "export for a cuda-named plugin: $(tail -2 "$TMP/err")"
check "auto for a non-cpu platform: every op at xla, and export names the guess" \
  "$PY -c 'import json,sys; ops=json.load(open(sys.argv[1]))[\"kernels\"][\"ops\"]; assert all(o[\"impl\"]==\"xla\" for o in ops), ops' '$TMP/bc/manifest.json' && grep -q 'platform cuda (guessed from the file name of the configured plugin' '$TMP/err'"
expect_exit 4 "kernels.rmsnorm=auto was resolved to xla for platform cuda .*but the plugin's platform is cpu, where auto means ffi: set kernels.rmsnorm=ffi" \
  train "${AUTO[@]}" runtime.plugin="$TMP/plug/pjrt_c_api_cuda_plugin.so" run.dir="$TMP/rc"
check "refused before any compile (no compile event)" "! grep -q '\"compile\"' '$TMP/rc/events.jsonl' 2>/dev/null"

edit() { # edit DIR PYTHON-STATEMENT-ON-k (the manifest's kernels.ops[0])
  cp -r "$TMP/b" "$1"
  $PY - "$1/manifest.json" "$2" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
k = m["kernels"]["ops"][0]
exec(sys.argv[2])
json.dump(m, open(sys.argv[1], "w"), indent=2)
PYEOF
}
edit "$TMP/b2" 'k["version"] = 2'
expect_exit 4 "kernel 'rmsnorm' was exported against contract version 2, the handler this strata registers is version 1" \
  train "${RUN[@]}" bundle.dir="$TMP/b2" run.dir="$TMP/r2"
check "refused before any compile (no compile event)" "! grep -q '\"compile\"' '$TMP/r2/events.jsonl' 2>/dev/null"
edit "$TMP/b3" 'k["targets"].append("strata_rmsnorm_bwd_v9")'
expect_exit 4 "kernel 'rmsnorm' \(contract version 1\) calls FFI target 'strata_rmsnorm_bwd_v9', which this strata does not register \(its 'rmsnorm' handlers are version 1" \
  train "${RUN[@]}" bundle.dir="$TMP/b3" run.dir="$TMP/r3"
check "refused before any compile (no compile event)" "! grep -q '\"compile\"' '$TMP/r3/events.jsonl' 2>/dev/null"
edit "$TMP/b4" 'k["targets"] = []; k["impl"] = "xla"'
expect_exit 4 "a custom call to 'strata_rmsnorm_(fwd|bwd)_v1'" train "${RUN[@]}" bundle.dir="$TMP/b4" run.dir="$TMP/r4"
expect_exit 2 "kernels.rmsnorm" train configs/test.yml kernels.rmsnorm=cuda run.dir="$TMP/r5"

finish test_kernels.sh
