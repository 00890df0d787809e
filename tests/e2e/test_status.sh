#!/usr/bin/env bash
# test_status.sh — `strata status RUN_DIR [--json]` on real runs (issue 16
# item 7): a finished run, a running one (its pid from the lock), one
# stopped by SIGTERM (exit 8), one SIGKILLed (no final event), one failed
# with an exit class, bad input, a torn log line, a huge metrics.jsonl.
# Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d /tmp/strata-e2e-status-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

source "$(dirname "$0")/lib.sh"

BASE=(configs/test.yml runtime.deterministic=true run.progress=off)
# json_field DIR EXPR: evaluates the Python expression EXPR over `strata status DIR --json` (as s).
json_check() {
  "$STRATA" status "$1" --json >"$TMP/js" 2>"$TMP/jserr" || return 1
  "$PY" -c "import json, sys; s = json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$TMP/js"
}
steps_in() {
  local n
  n=$(grep -c '"loss"' "$1/metrics.jsonl" 2>/dev/null)
  echo "${n:-0}"
}
wait_steps() { for _ in $(seq 600); do [ "$(steps_in "$1")" -ge "$2" ] && return 0; sleep 0.1; done; return 1; }

# --- a finished run ----------------------------------------------------------
d="$TMP/done"
if "$STRATA" train "${BASE[@]}" train.steps=4 ckpt.every=2 run.dir="$d" >/dev/null 2>"$TMP/err"; then ok; else bad "train exited $?"; fi
expect_exit 0 "^state +finished$" status "$d"
check "finished: step 4/4, loss, tokens/s, checkpoint step_4, lock free, no ETA" \
  "grep -q '^step  *4/4$' '$TMP/out' && grep -Eq '^loss +[0-9.]+$' '$TMP/out' && grep -Eq '^tokens/s +[0-9.]+k?$' '$TMP/out' && grep -q '^checkpoint  *step_4 (verified)$' '$TMP/out' && grep -q '^lock  *free$' '$TMP/out' && ! grep -q ETA '$TMP/out'"
check "finished --json: the fields" "json_check '$d' \"s['state'] == 'finished' and s['pid'] is None and s['exit_code'] == 0 and s['exit_class'] == 'ok' and s['step'] == 4 and s['total_steps'] == 4 and isinstance(s['loss'], float) and s['tokens_per_s'] > 0 and s['step_time_s'] > 0 and s['step_time_steps'] == 4 and s['eta_s'] is None and s['checkpoint'] == 'step_4' and s['checkpoint_step'] == 4 and s['checkpoints_invalid'] == 0 and s['lock'] == {'file': '.lock', 'held': False, 'pid': None} and s['last_event'] == 'done'\""
expect_exit 0 "^state +finished$" status "$d/"

# The newest checkpoint damaged: status names the one a resume would take.
printf 'x' | dd of="$d/checkpoints/step_4/params.safetensors" bs=1 seek=200 conv=notrunc 2>/dev/null
check "a damaged newest checkpoint: step_2 is the newest valid, one invalid skipped" \
  "json_check '$d' \"s['checkpoint'] == 'step_2' and s['checkpoints_invalid'] == 1\""

# --- running, then SIGTERM: exit 8, interrupted -------------------------------
d="$TMP/term"
"$STRATA" train "${BASE[@]}" train.steps=100000 ckpt.every=0 run.dir="$d" >/dev/null 2>"$TMP/err" &
pid=$!
wait_steps "$d" 5 || bad "the run did not reach step 5"
expect_exit 0 "^state +running \\(pid $pid\\)$" status "$d"
check "running: the lock holder is the trainer, an ETA from the steps left" \
  "grep -q '^lock  *.lock held by pid $pid$' '$TMP/out' && grep -Eq '^ETA +[0-9]+[hms]' '$TMP/out' && grep -Eq '^step +[0-9]+/100000$' '$TMP/out'"
check "running --json: pid, lock, eta, no exit code" \
  "json_check '$d' \"s['state'] == 'running' and s['pid'] == $pid and s['lock']['held'] and s['lock']['pid'] == $pid and s['eta_s'] > 0 and s['exit_code'] is None and s['step'] >= 5\""
check "status takes no lock and writes nothing: the run goes on" "kill -0 $pid && [ \"\$(cat '$d/.lock')\" = $pid ]"
kill -TERM "$pid"
wait "$pid"
rc=$?
check "SIGTERM: the trainer exits 8 (rc $rc)" "[ $rc = 8 ]"
n=$(grep '"loss"' "$d/metrics.jsonl" | tail -1 | sed 's/^{"step": \([0-9]*\),.*/\1/')
expect_exit 0 "^state +interrupted by SIGTERM \\(exit 8\\)$" status "$d"
check "interrupted: its checkpoint step_$n, lock free" "grep -q '^checkpoint  *step_$n (verified)$' '$TMP/out' && grep -q '^lock  *free$' '$TMP/out'"
check "interrupted --json" \
  "json_check '$d' \"s['state'] == 'interrupted' and s['signal'] == 'SIGTERM' and s['exit_code'] == 8 and s['exit_class'] == 'interrupted' and s['step'] == $n and s['checkpoint'] == 'step_$n' and s['pid'] is None and s['eta_s'] is None\""

# --- under strata run: the supervisor holds the lock, its summary comes last --
d="$TMP/sup"
"$STRATA" run "${BASE[@]}" train.steps=100000 ckpt.every=0 run.dir="$d" >/dev/null 2>"$TMP/err" &
sup=$!
wait_steps "$d" 3 || bad "strata run did not reach step 3"
expect_exit 0 "^state +running \\(pid $sup\\)$" status "$d"
kill -TERM "$sup"
wait "$sup"
rc=$?
check "SIGTERM to strata run: exit 8 (rc $rc)" "[ $rc = 8 ]"
expect_exit 0 "^state +interrupted by SIGTERM \\(exit 8\\)$" status "$d"
check "supervised: the supervisor's outcome, after its own final event" \
  "grep -q '^supervisor  *strata run: interrupted (recovery.json)$' '$TMP/out' && tail -1 '$d/events.jsonl' | grep -q supervisor_done && json_check '$d' \"s['state'] == 'interrupted' and s['signal'] == 'SIGTERM' and s['supervisor_outcome'] == 'interrupted' and s['last_event'] == 'supervisor_done'\""

# --- SIGKILLed while hung: no final event ------------------------------------
d="$TMP/kill"
"$STRATA" train "${BASE[@]}" train.steps=100 faults.hang_at_step=3 run.dir="$d" >/dev/null 2>"$TMP/err" &
pid=$!
for _ in $(seq 600); do grep -q hang_at_step "$d/diag/faults.fired" 2>/dev/null && break; sleep 0.1; done
check "hung run: still running (pid $pid)" "json_check '$d' \"s['state'] == 'running' and s['pid'] == $pid\""
kill -KILL "$pid"
wait "$pid" 2>/dev/null
expect_exit 0 "^error +ended without a final event: killed \\(SIGKILL, out of memory\\) or crashed$" status "$d"
check "SIGKILLed: failed, step 2/100, no checkpoint, lock free (the kernel released it)" \
  "grep -q '^state  *failed$' '$TMP/out' && grep -q '^step  *2/100$' '$TMP/out' && grep -q '^checkpoint  *none$' '$TMP/out' && grep -q '^lock  *free$' '$TMP/out'"

# --- failed with an exit class ------------------------------------------------
d="$TMP/fail"
"$STRATA" train "${BASE[@]}" train.steps=6 ckpt.every=2 faults.io_error_at_save=1 run.dir="$d" >/dev/null 2>"$TMP/err"
rc=$?
check "an injected ENOSPC at the first save: exit 7 (rc $rc)" "[ $rc = 7 ]"
expect_exit 0 "^state +failed \\(exit 7, checkpoint error\\)$" status "$d"
check "failed: the error message from the failed event" "grep -q '^error .*No space left on device (injected by faults.io_error_at_save=1)' '$TMP/out'"
check "failed --json" "json_check '$d' \"s['state'] == 'failed' and s['exit_code'] == 7 and s['exit_class'] == 'checkpoint error' and 'No space left' in s['error']\""

# --- a torn last line: warned, ignored ---------------------------------------
d="$TMP/done"
printf '{"step": 99, "loss": 1.0, "tok' >>"$d/metrics.jsonl"
expect_exit 0 "^step +4/4$" status "$d"
check "a torn metrics line: a warning naming the file and the fix" \
  "grep -q \"^strata: warning: $d/metrics.jsonl ends in a torn line (a crash mid-write); ignored here, .strata resume $d. cuts it\$\" '$TMP/err'"

# --- a huge metrics.jsonl: only its tail is read ---------------------------------
d="$TMP/big"
cp -r "$TMP/term" "$d"
"$PY" - "$d/metrics.jsonl" <<'PYEOF'
import sys
lines = open(sys.argv[1]).read()
with open(sys.argv[1], 'w') as f:
    f.write('not json, never read\n' * 2_000_000)  # ~40 MB of junk before the real lines
    f.write(lines * (1 + 70_000 // len(lines)))  # then more than the 64 KiB tail of them
PYEOF
expect_exit 0 "^state +interrupted by SIGTERM" status "$d"
check "a 40 MB metrics.jsonl: read from its tail (junk before it never parsed)" "grep -Eq '^step +[0-9]+/100000$' '$TMP/out'"
at=$(stat -c %s "$d/metrics.jsonl")
"$PY" -c "import sys; open(sys.argv[1], 'a').write('{\"step\": 1,\n')" "$d/metrics.jsonl"
expect_config_error "$PWD" 2 "strata status: '$d/metrics.jsonl' holds a line that is not JSON (at byte $at); it is not a strata run log, or was edited" -- status "$d"

# --- a run starting: the lock held, no logs yet ------------------------------
d="$TMP/starting"
mkdir -p "$d"
echo 4242 >"$d/.lock" # the pid st_fs_lock writes; flock(1) holds the lock itself
flock -o "$d/.lock" sleep 30 & # -o: the lock is flock(1)'s alone, gone when it is killed
fpid=$!
for _ in $(seq 100); do flock -n "$d/.lock" true || break; sleep 0.05; done
expect_exit 0 "^state +running \\(pid 4242\\)$" status "$d"
check "starting: no step yet, lock held by the pid in .lock" "grep -q '^step  *none recorded (starting)$' '$TMP/out' && grep -q '^lock  *.lock held by pid 4242$' '$TMP/out'"
pkill -P "$fpid" # its sleep, then flock(1) itself
kill "$fpid" 2>/dev/null
wait "$fpid" 2>/dev/null
expect_config_error "$PWD" 2 "strata status: '$d' is not a run directory: it has no events.jsonl (strata train and strata run write it when they start)" -- status "$d"

# --- bad input -------------------------------------------------------------------
expect_config_error "$PWD" 2 "strata status: '$TMP/nope' does not exist; give the run directory strata train printed" -- status "$TMP/nope"
mkdir -p "$TMP/notrun"
expect_config_error "$PWD" 2 "strata status: '$TMP/notrun' is not a run directory: it has no events.jsonl (strata train and strata run write it when they start)" -- status "$TMP/notrun"
touch "$TMP/notrun/file"
expect_config_error "$PWD" 2 "strata status: '$TMP/notrun/file' is not a run directory: not a folder" -- status "$TMP/notrun/file"
expect_exit 2 "usage: strata status RUN_DIR \\[--json\\]" status
expect_exit 2 "usage: strata status RUN_DIR \\[--json\\]" status a b
expect_exit 0 "usage: strata status RUN_DIR \\[--json\\]" status --help
mkdir -p "$TMP/dirlog/events.jsonl"
expect_config_error "$PWD" 2 "strata status: '$TMP/dirlog/events.jsonl' is not a regular file; is this a run directory?" -- status "$TMP/dirlog"
# Unreadable: root reads everything, so this runs only as another user.
if [ "$(id -u)" != 0 ]; then
  d="$TMP/noread"
  cp -r "$TMP/fail" "$d"
  chmod 000 "$d/events.jsonl"
  expect_exit 9 "cannot read '$d/events.jsonl': Permission denied; check its permissions" status "$d"
  chmod 644 "$d/events.jsonl"
fi
expect_exit 0 "status RUN_DIR \\[--json\\]" --help

finish test_status.sh
