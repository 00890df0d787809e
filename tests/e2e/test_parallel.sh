#!/usr/bin/env bash
# test_parallel.sh — the parallel.* keys (docs/parallelism.md): every mesh
# rule gives exit 2 with its exact message naming the keys, their values
# and where they were set; a valid mesh passes `strata config`; and
# `strata train` refuses fsdp or tensor above 1 (not built yet) with exit 2
# before it creates anything, while parallel.data > 1 trains (its
# equivalence with one device: tests/py/test_data_parallel.py). Run from
# the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
TMP=$(mktemp -d /tmp/strata-e2e-parallel-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

source "$(dirname "$0")/lib.sh"

# expect_error MESSAGE ARGS...: exit 2, exactly "strata: config error:
# MESSAGE" on stderr, nothing on stdout.
expect_error() {
  local msg=$1
  shift
  local out code err
  out=$("$STRATA" "$@" 2>"$TMP/stderr")
  code=$?
  err=$(cat "$TMP/stderr")
  if [ "$code" != 2 ]; then
    bad "strata $*: exit $code, want 2 (stderr: $err)"
  elif [ "$err" != "strata: config error: $msg" ]; then
    bad "strata $*: stderr was
  $err
want
  strata: config error: $msg"
  elif [ -n "$out" ]; then
    bad "strata $*: wrote to stdout on error: $out"
  else
    ok
  fi
}

# --- the rules --------------------------------------------------------------
expect_error "parallel.data x parallel.fsdp x parallel.tensor = 1 x 4 x 1 = 4 devices (configs/base.yml:58, command line, configs/base.yml:60), but runtime.cpu_devices is 2 (configs/base.yml:51)" \
  config configs/test.yml parallel.fsdp=4
expect_error "parallel.data x parallel.fsdp x parallel.tensor = 2 x 2 x 2 = 8 devices (command line, command line, command line), but runtime.cpu_devices is 4 (command line)" \
  config configs/test.yml parallel.data=2 parallel.fsdp=2 parallel.tensor=2 runtime.cpu_devices=4
expect_error "model.n_heads (2, configs/test.yml:8) is not divisible by parallel.tensor (4, command line): tensor parallelism splits the attention heads" \
  config configs/test.yml parallel.tensor=4 runtime.cpu_devices=4
expect_error "model.d_ff (66, command line) is not divisible by parallel.tensor (4, command line): tensor parallelism splits the MLP hidden dimension" \
  config configs/test.yml parallel.tensor=4 runtime.cpu_devices=4 model.n_heads=4 model.d_ff=66
expect_error "the microbatch train.batch_size / train.microbatches = 4 / 2 = 2 (configs/test.yml:14, configs/test.yml:15) is not divisible by parallel.data x parallel.fsdp = 2 x 2 = 4 (command line, command line): every device takes an equal share of each microbatch" \
  config configs/test.yml parallel.data=2 parallel.fsdp=2 runtime.cpu_devices=4
expect_error "parallel.fsdp: 0 is out of range [1, 4096] (command line)" config configs/test.yml parallel.fsdp=0

# --- a valid mesh ---------------------------------------------------------------
out=$("$STRATA" config configs/test.yml parallel.data=2 parallel.fsdp=2 train.microbatches=1 runtime.cpu_devices=4 2>"$TMP/stderr")
check "a valid 2 x 2 mesh passes strata config (stderr: $(cat "$TMP/stderr"))" \
  "grep -Eq '^parallel.fsdp +2 +command line' <<<\"\$out\" && grep -Eq '^parallel.tensor +1 +configs/base.yml:60' <<<\"\$out\""
out=$("$STRATA" config --yaml configs/test.yml 2>/dev/null)
check "the YAML snapshot has the parallel section with its defaults" \
  "grep -A3 '^parallel:' <<<\"\$out\" | grep -q '  tensor: 1'"

# --- the trainer refuses fsdp and tensor, creating nothing -------------------------
expect_error "parallel.data=1 parallel.fsdp=2 parallel.tensor=1: fully-sharded and tensor parallelism are not yet supported in training (the runtime and the collective programs exist, the step plan has data parallelism only; docs/parallelism.md); set parallel.fsdp and parallel.tensor to 1" \
  train configs/test.yml parallel.fsdp=2 run.dir="$TMP/run"
check "the refused run created no run directory" "[ ! -e '$TMP/run' ]"
expect_error "parallel.data=2 parallel.fsdp=1 parallel.tensor=2: fully-sharded and tensor parallelism are not yet supported in training (the runtime and the collective programs exist, the step plan has data parallelism only; docs/parallelism.md); set parallel.fsdp and parallel.tensor to 1" \
  train configs/test.yml parallel.data=2 parallel.tensor=2 runtime.cpu_devices=4 run.dir="$TMP/run"

# --- data parallelism trains --------------------------------------------------------
"$STRATA" train configs/test.yml parallel.data=2 runtime.cpu_devices=4 train.steps=2 run.dir="$TMP/dp" \
  >"$TMP/dp.out" 2>"$TMP/dp.err"
code=$?
check "parallel.data=2 trains (exit $code; stderr: $(tail -3 "$TMP/dp.err"))" "[ $code = 0 ]"
check "its metrics count the all-reduces: one per group instance" \
  "grep -q '\"collectives\": 4' '$TMP/dp/metrics.jsonl'"
out=$("$STRATA" plan configs/test.yml parallel.data=2 runtime.cpu_devices=4 2>/dev/null)
check "strata plan shows the COLLECTIVE ops and the policy" \
  "grep -Eq 'COLLECTIVE +block_data_all_reduce layer=1' <<<\"\$out\" && grep -q 'data=2 grad_reduce=per_layer' <<<\"\$out\""
expect_error "sched.optimizer=per_layer (command line) updates each layer as soon as its gradient is reduced, so with parallel.data=2 (command line) it needs sched.grad_reduce=per_layer, not bucketed (command line)" \
  config configs/test.yml parallel.data=2 runtime.cpu_devices=4 sched.optimizer=per_layer train.grad_clip=0 sched.grad_reduce=bucketed

finish test_parallel.sh
