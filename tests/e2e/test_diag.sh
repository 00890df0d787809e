#!/usr/bin/env bash
# test_diag.sh — diagnostics end to end (issue 15, docs/diagnostics.md), on
# the real trainer and CPU plugin, with a NaN injected by faults.nan_at:
#   1. stop: exit 5, one "step N:" in the message, a nonfinite event;
#      under `strata run` a persistent NaN (faults.repeat) is not restarted
#   2. skip: the run goes on; the skipped step's checkpoint holds exactly
#      the state before it (params, m, v bitwise); diag.max_skipped bounds it
#   3. rollback: restores the newest checkpoint and goes on to the end;
#      with sched.optimizer=per_layer (whose update already applied the NaN)
#      it ends bitwise equal to the skip run: the restore really happened;
#      a window of several steps; no checkpoint or diag.max_rollbacks -> exit 5
#   4. located: NaN at step 7, layer 2, microbatch 1 named exactly (program,
#      layer, microbatch, tensor), its bundle complete; `strata repro`
#      reproduces it, and does not without the injection's record; a
#      genuine overflow (faults.nan_value=max) located in the program that
#      overflows and reproduced; an altered program refused; --perf times
#      the program against the launch time the bundle records
#   5. config: faults.nan_at syntax and range, skip with per_layer: exit 2
#   6. drills checked up front (issue 24): faults.nan_at under
#      parallel.tensor=2 fires and is located (exit 5); a bad TENSOR is
#      refused before anything compiles; a step or save the run never
#      reaches is refused (exit 2); a completed run whose drill never fired
#      exits 2 with faults_unfired in run_done and failed
# Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
TMP=$(mktemp -d /tmp/strata-e2e-diag-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# The cache of the whole make test when run_all.sh shares one (tests/README.md, "Time"); alone, a private one.
[ "${STRATA_E2E_SHARED_CACHE:-0}" = 1 ] || export STRATA_CACHE_DIR="$TMP/cache"
source "$(dirname "$0")/lib.sh"

# Deterministic, one device: bitwise-repeatable steps (docs/runtime.md).
BASE=(configs/test.yml runtime.deterministic=true runtime.cpu_devices=1 run.progress=off)
ev() { grep -h "\"event\": \"$2\"" "$1/events.jsonl"; }

# --- 1. stop -------------------------------------------------------------------
expect_exit 5 'numerics error: step 3: loss of microbatch 1 is not finite \(nan\); the update was not applied; stopped \(diag.on_nonfinite=stop\)' \
  train "${BASE[@]}" faults.nan_at=3:1 faults.nan_micro=1 run.dir="$TMP/stop"
check "the step is named once (no 'step 3: step 3:')" "! grep -q 'step 3: step 3' '$TMP/err'"
check "stop: a nonfinite event with action stop" \
  "ev '$TMP/stop' nonfinite | grep -q '\"step\": 3, \"what\": \"loss of microbatch 1\".*\"action\": \"stop\"'"
check "stop: the failed event says exit 5" "ev '$TMP/stop' failed | grep -q '\"exit_code\": 5'"
check "stop: no metrics line of step 3" "! grep -q '\"step\": 3,' '$TMP/stop/metrics.jsonl'"

# strata run: a NaN that comes back in every attempt is not restarted.
expect_exit 5 'exited 5 \(non-finite numerics error\); not restarting' \
  run "${BASE[@]}" faults.nan_at=3:0 faults.repeat=true recovery.backoff_s=0 run.dir="$TMP/sup"
check "strata run: one child, no restart" \
  "[ \$(ev '$TMP/sup' child_start | wc -l) = 1 ] && [ \$(ev '$TMP/sup' restart | wc -l) = 0 ]"
check "strata run: giving_up with exit 5" "ev '$TMP/sup' giving_up | grep -q '\"exit_code\": 5'"
check "strata run: recovery.json not_restartable, no incident" \
  "grep -q '\"outcome\": \"not_restartable\"' '$TMP/sup/recovery.json' && grep -q '\"incidents_total\": 0' '$TMP/sup/recovery.json'"

# --- 2. skip -------------------------------------------------------------------
NAN=(faults.nan_at=7:1 faults.nan_micro=1 ckpt.every=1 ckpt.keep=20 train.grad_clip=0)
"$STRATA" train "${BASE[@]}" "${NAN[@]}" diag.on_nonfinite=skip run.dir="$TMP/skip" >/dev/null 2>"$TMP/skip.err" &&
  ok || bad "skip run failed: $(tail -3 "$TMP/skip.err")"
check "skip: the nonfinite event" \
  "ev '$TMP/skip' nonfinite | grep -q '\"step\": 7,.*\"action\": \"skip\", \"skipped_steps\": 1'"
for f in params optimizer; do
  check "skip: step_7's $f equal step_6's bitwise (the update was never applied)" \
    "cmp -s '$TMP/skip/checkpoints/step_6/$f.safetensors' '$TMP/skip/checkpoints/step_7/$f.safetensors'"
  check "skip: step_6's $f differ from step_5's (steps do update)" \
    "! cmp -s '$TMP/skip/checkpoints/step_5/$f.safetensors' '$TMP/skip/checkpoints/step_6/$f.safetensors'"
done
check "skip: metrics line of step 7 says update_skipped" \
  "grep '\"step\": 7,' '$TMP/skip/metrics.jsonl' | grep -q '\"loss\": null.*\"update_skipped\": true, \"skipped_steps\": 1'"
check "skip: the run ran to the end" "ev '$TMP/skip' run_done | grep -q '\"steps\": 10,.*\"skipped_steps\": 1'"
check "skip: the drill fired: faults_unfired is empty" "ev '$TMP/skip' run_done | grep -q '\"faults_unfired\": \[\]'"
expect_exit 5 'step 7: loss of microbatch 1 is not finite.*diag.on_nonfinite=skip: diag.max_skipped=0' \
  train "${BASE[@]}" "${NAN[@]}" diag.on_nonfinite=skip diag.max_skipped=0 run.dir="$TMP/skip_max"

# --- 3. rollback ---------------------------------------------------------------
# per_layer has applied step 7's NaN update before the norm is known: only a
# real restore of step_6 gives the skip run's parameters.
"$STRATA" train "${BASE[@]}" "${NAN[@]}" diag.on_nonfinite=rollback sched.optimizer=per_layer run.dir="$TMP/rb" \
  >/dev/null 2>"$TMP/rb.err" && ok || bad "rollback run failed: $(tail -3 "$TMP/rb.err")"
check "rollback: the nonfinite event names step_6 and the skipped data" \
  "ev '$TMP/rb' nonfinite | grep -q '\"update_applied\": true,.*\"action\": \"rollback\", \"checkpoint\": \"[^\"]*step_6\", \"restored_step\": 6, \"skipped_from_step\": 7, \"skipped_to_step\": 7, \"skipped_first_sample\": 24, \"skipped_samples\": 4'"
check "rollback (per_layer) ends bitwise equal to skip (after_backward)" \
  "cmp -s '$TMP/skip/params.safetensors' '$TMP/rb/params.safetensors'"
# A window: checkpoints every 5 steps, NaN at 7: back to 5, steps 6-7's data skipped.
"$STRATA" train "${BASE[@]}" faults.nan_at=7:0 ckpt.every=5 diag.on_nonfinite=rollback run.dir="$TMP/rb5" \
  >/dev/null 2>"$TMP/rb5.err" && ok || bad "rollback window run failed: $(tail -3 "$TMP/rb5.err")"
check "rollback window: restored 5, skipped 6..7" \
  "ev '$TMP/rb5' nonfinite | grep -q '\"restored_step\": 5, \"skipped_from_step\": 6, \"skipped_to_step\": 7'"
check "rollback window: run_done, finite final loss, 2 steps skipped" \
  "ev '$TMP/rb5' run_done | grep -Eq '\"final_loss\": [0-9].*\"skipped_steps\": 2, \"rollbacks\": 1'"
expect_exit 5 'diag.on_nonfinite=rollback: no checkpoint to roll back to' \
  train "${BASE[@]}" faults.nan_at=3:0 ckpt.every=5 diag.on_nonfinite=rollback run.dir="$TMP/rb_none"
expect_exit 5 'diag.max_rollbacks=0 rollbacks were made already' \
  train "${BASE[@]}" faults.nan_at=7:0 ckpt.every=5 diag.on_nonfinite=rollback diag.max_rollbacks=0 run.dir="$TMP/rb_max"

# --- 4. the first non-finite value, located and replayed -------------------------
# Acceptance (issue 15): a NaN at step 7, layer 2, microbatch 1.
L3=("${BASE[@]}" model.n_layers=3)
expect_exit 5 'step 7: the first non-finite value: block_fwd_res, layer 2, microbatch 1, output y \(inputs finite\)' \
  train "${L3[@]}" faults.nan_at=7:2 faults.nan_micro=1 run.dir="$TMP/loc"
NB="$TMP/loc/diag/nonfinite-step7"
check "located: the nonfinite_located event names program, layer, microbatch, tensor" \
  "ev '$TMP/loc' nonfinite_located | grep -q '\"step\": 7, \"program\": \"block_fwd_res\", \"op_kind\": \"LAUNCH\", \"plan_op\": [0-9]*, \"layer\": 2, \"microbatch\": 1, \"output\": \"y\", \"output_index\": 0, \"nonfinite\": 1,.*\"inputs_finite\": true'"
check "located: the nonfinite event points at the bundle" "ev '$TMP/loc' nonfinite | grep -q '\"located\": \"[^\"]*nonfinite-step7\"'"
for f in inputs.safetensors program.mlir config.yaml nonfinite.json README.md; do
  check "bundle has $f" "[ -s '$NB/$f' ]"
done
check "bundle: the batch's sample indices (microbatch 1 of step 7: sequences 26, 27)" \
  "grep -q '\"samples\": {\"first\": 26, \"count\": 2' '$NB/nonfinite.json'"
check "bundle: the injection is recorded" "grep -q '\"injected\": {\"fault\": \"faults.nan_at\"' '$NB/nonfinite.json'"
check "bundle: README has the replay line" "grep -q 'strata repro $NB' '$NB/README.md'"
expect_exit 0 '^reproduces: program block_fwd_res, output y: 2 of 2 replays non-finite' repro "$NB"
check "xla: repro has no other implementation to compare" "grep -q '^reference: none (no kernel replaces' '$TMP/out'"
# With the kernels at ffi the saved program calls strata's FFI targets: repro
# registers them before compiling it (before: "No FFI handler registered").
expect_exit 5 'step 3: the first non-finite value: block_fwd_res, layer 2' \
  train "${L3[@]}" kernels.rmsnorm=ffi kernels.swiglu=ffi kernels.cross_entropy=ffi kernels.attention=ffi \
  faults.nan_at=3:2 run.dir="$TMP/locffi"
check "ffi: the saved program calls the kernels" "grep -q 'custom_call @strata_' '$TMP/locffi/diag/nonfinite-step3/program.mlir'"
expect_exit 0 '^reproduces: program block_fwd_res, output y' repro "$TMP/locffi/diag/nonfinite-step3"
check "ffi: repro says the xla reference was not compared" "grep -q '^reference: not compared (the program calls strata' '$TMP/out'"
check "ffi: repro --json says the program calls kernels" \
  "'$STRATA' repro '$TMP/locffi/diag/nonfinite-step3' --json | grep -q '\"calls_kernels\": true'"
# Without the record of the injection the program alone gives finite values.
sed 's/"injected": {[^}]*}/"injected": null/' "$NB/nonfinite.json" >"$TMP/nf.json" && cp -r "$NB" "$TMP/noinj" && cp "$TMP/nf.json" "$TMP/noinj/nonfinite.json"
expect_exit 0 '^does not reproduce: program block_fwd_res, output y: 0 of 2 replays' repro "$TMP/noinj"
# --perf (issue 30): timed launches against the launch time the bundle records.
check "bundle: the culprit launch's time is recorded" \
  "grep -Eq '\"launch_time\": \\{\"seconds\": [0-9.e-]+, \"launches\": 1' '$NB/nonfinite.json'"
expect_exit 0 '^perf: block_fwd_res: 5 launches: median [0-9.]+ ms \(10th-90th percentile' repro "$NB" --perf=5
check "perf: the replays against the recorded figure" \
  "grep -Eq '^perf: recorded [0-9.]+ ms \(one launch, the run.s locator\): replay median / recorded = [0-9.]+; the recorded figure is (below|within|above)' '$TMP/out'"
check "perf: --json" "'$STRATA' repro '$NB' --perf=3 --json | grep -q '\"runs\": 3,'"
sed 's/"launch_time": {[^}]*}/"launch_time": null/' "$NB/nonfinite.json" >"$TMP/nf.json" && cp -r "$NB" "$TMP/noperf" && cp "$TMP/nf.json" "$TMP/noperf/nonfinite.json"
expect_exit 0 '^perf: recorded: none \(this bundle records no launch time' repro "$TMP/noperf" --perf=2
expect_exit 2 '--perf=0: expected a count of timed launches in 1..100000' repro "$NB" --perf=0
# A genuine one: the largest finite f32 in layer 1's residual 'gate' makes a
# program overflow by itself (the embedding's squared gradient norm).
expect_exit 5 'the first non-finite value: sqnorm_embed, output sqnorm \(inputs finite\)' \
  train "${L3[@]}" faults.nan_at=7:1:gate faults.nan_value=max run.dir="$TMP/big"
check "genuine: not injected" "grep -q '\"injected\": null' '$TMP/big/diag/nonfinite-step7/nonfinite.json'"
expect_exit 0 '^reproduces: program sqnorm_embed, output sqnorm: 2 of 2 replays non-finite' repro "$TMP/big/diag/nonfinite-step7"
expect_exit 0 '"verdict": "reproduces"' repro "$TMP/big/diag/nonfinite-step7" --json
# An altered program is refused.
cp -r "$NB" "$TMP/tampered" && echo "// changed" >>"$TMP/tampered/program.mlir"
expect_exit 2 'program.mlir: sha256 .* the program was changed' repro "$TMP/tampered"
expect_exit 2 'is not a non-finite bundle' repro "$TMP"

# --- 5. config -----------------------------------------------------------------
expect_exit 2 "faults.nan_at 'x': STEP must be a whole number" train "${BASE[@]}" faults.nan_at=x run.dir="$TMP/c1"
expect_exit 2 'faults.nan_at names layer 2, but model.n_layers is 2' train "${BASE[@]}" faults.nan_at=3:2 run.dir="$TMP/c2"
expect_exit 2 'faults.nan_at names step 11, but train.steps is 10' train "${BASE[@]}" faults.nan_at=11:0 run.dir="$TMP/c3"
expect_exit 2 'faults.nan_micro .* is 2, but train.microbatches is 2' \
  train "${BASE[@]}" faults.nan_at=3:0 faults.nan_micro=2 run.dir="$TMP/c4"
expect_exit 2 'diag.on_nonfinite=skip drops a step.s update' \
  train "${BASE[@]}" train.grad_clip=0 sched.optimizer=per_layer diag.on_nonfinite=skip run.dir="$TMP/c5"
expect_exit 2 "program '[a-z_]+' has no output 'nope'" train "${BASE[@]}" faults.nan_at=2:0:nope run.dir="$TMP/c6"

# --- 6. drills checked up front ---------------------------------------------------
# Tensor parallelism: the block is one SPMD program over both devices; the
# drill poisons device index 0's output and the locator names it (before:
# armed, never fired, exit 0).
TP=(configs/test.yml runtime.deterministic=true runtime.cpu_devices=2 parallel.tensor=2 run.progress=off train.steps=3)
expect_exit 5 'step 2: the first non-finite value: tp_block_fwd_res, layer 1, microbatch 1, output y \(inputs finite\)' \
  train "${TP[@]}" faults.nan_at=2:1 faults.nan_micro=1 run.dir="$TMP/tp"
check "tensor=2: the drill fired" "grep -q 'FAULT INJECTED: nan_at=2' '$TMP/err' && grep -q '^nan_at 2 ' '$TMP/tp/diag/faults.fired'"
check "tensor=2: the bundle records the injection and the SPMD program" \
  "grep -q '\"injected\": {\"fault\": \"faults.nan_at\"' '$TMP/tp/diag/nonfinite-step2/nonfinite.json' && grep -q '\"spmd_devices\": 2' '$TMP/tp/diag/nonfinite-step2/nonfinite.json'"
expect_exit 2 'tp_block_fwd_res is a tensor-parallel SPMD program over 2 devices.*strata repro replays one-device programs' \
  repro "$TMP/tp/diag/nonfinite-step2"
# A bad output name: refused once the plan is known, before anything compiles
# or runs (before: at step 5).
expect_exit 2 "faults.nan_at=5:1:bogus: program 'block_fwd_res' has no output 'bogus' \(it is layer 1's training forward\); its outputs are y, q, k" \
  train "${BASE[@]}" faults.nan_at=5:1:bogus run.dir="$TMP/bogus"
check "bad TENSOR: nothing compiled, no step ran" \
  "! grep -q '\"event\": \"compile\"' '$TMP/bogus/events.jsonl' && ! grep -q '\"first_step\"' '$TMP/bogus/events.jsonl' && [ ! -s '$TMP/bogus/metrics.jsonl' ]"
expect_exit 2 "faults.nan_at=2:1:bogus: program 'tp_block_fwd_res' has no output 'bogus'" \
  train "${TP[@]}" faults.nan_at=2:1:bogus run.dir="$TMP/tp_bogus"
# Steps beyond train.steps: refused by the config rules, before a run directory exists.
expect_exit 2 'faults.crash_at_step \(command line\) names step 11, but train.steps is 10 .*: the drill would never fire' \
  train "${BASE[@]}" faults.crash_at_step=11 run.dir="$TMP/c7"
expect_exit 2 'faults.hang_in \(command line\): faults.hang_in=block_fwd_res:11 names step 11, but train.steps is 10' \
  train "${BASE[@]}" faults.hang_in=block_fwd_res:11 run.dir="$TMP/c8"
check "steps beyond train.steps: no run directory" "[ ! -e '$TMP/c7' ] && [ ! -e '$TMP/c8' ]"
# A save beyond the saves the run can begin (3 steps, ckpt.every=50: the last
# step's, and one for a stop).
expect_exit 2 'faults.io_error_at_save=5 cannot fire: it counts this process.s checkpoint saves, and this run begins at most 2' \
  train "${BASE[@]}" train.steps=3 faults.io_error_at_save=5 run.dir="$TMP/c9"
check "save beyond the run's: no step ran" "[ ! -s '$TMP/c9/metrics.jsonl' ]"
# The stop's save is allowed for; without a stop the drill never fires: the
# run completes, says so and exits 2.
expect_exit 2 'the run completed \(steps 1 to 3, 1 checkpoint save\) but faults.io_error_at_save=2 never fired' \
  train "${BASE[@]}" train.steps=3 faults.io_error_at_save=2 run.dir="$TMP/unfired"
check "unfired: run_done and failed name it, failed says exit 2" \
  "ev '$TMP/unfired' run_done | grep -q '\"faults_unfired\": \[\"faults.io_error_at_save=2\"\]' && ev '$TMP/unfired' failed | grep -q '\"exit_code\": 2, \"class\": \"config\", \"faults_unfired\": \[\"faults.io_error_at_save=2\"\]'"
check "unfired: the run itself completed (final parameters saved)" "[ -s '$TMP/unfired/params.safetensors' ]"
# A resume starts after its checkpoint: a step drill before it never runs.
expect_exit 2 'faults.crash_at_step=2 cannot fire: this run resumes after step 3, so step 2 never runs in it' \
  resume "$TMP/unfired" train.steps=5 faults.io_error_at_save=0 faults.crash_at_step=2

finish test_diag.sh
