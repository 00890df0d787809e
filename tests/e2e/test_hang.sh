#!/usr/bin/env bash
# test_hang.sh — the in-process hang watchdog and loss spikes end to end
# (issue 15 items 5-7, docs/diagnostics.md), on the real trainer, CPU
# plugin, processes and signals:
#   1. faults.hang_in blocks inside a launch at step 3; the watchdog detects
#      it within its deadline + 1 s, writes diag/hang-<time>/ naming the
#      op, and the trainer exits 6
#      (1b: faults.hang_at_step, a host hang between ops, is a hung step)
#   2. under `strata run` the child is restarted after exit 6 and the run
#      completes, bitwise identical to an uninterrupted run
#   3. faults.hang_in naming no launched program, or a bad step: exit 2
#   4. loss_spike events agree with the z-scores recomputed from
#      metrics.jsonl, both ways, and carry the batch's sample indices
# Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=$(realpath "${PY:-.venv/bin/python}")
DRILL="$PY $(realpath tests/e2e/ckpt_drill.py)"
TMP=$(mktemp -d /tmp/strata-e2e-hang-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# The cache of the whole make test when run_all.sh shares one (tests/README.md, "Time"); alone, a private one.
[ "${STRATA_E2E_SHARED_CACHE:-0}" = 1 ] || export STRATA_CACHE_DIR="$TMP/cache"

source "$(dirname "$0")/lib.sh"

# train.lr=0.1: a loss that does not only fall, so that loss spikes (4.) are scored on a real series.
BASE=(configs/test.yml runtime.deterministic=true runtime.cpu_devices=1 run.progress=off train.steps=8 ckpt.every=2 train.lr=0.1)
# A margin of 2 s: a loaded test machine must not make a healthy op late.
WATCH=(diag.hang_timeout_s=2 diag.hang_floor_s=0.5)
HANG=(faults.hang_in=block_bwd_res:3)

# --- the reference, with loss spikes scored on a tiny window ---------------------
SPIKE=(diag.spike_z=0.05 diag.spike_window=3)
if "$STRATA" train "${BASE[@]}" "${SPIKE[@]}" run.dir="$TMP/ref" >/dev/null 2>"$TMP/ref.err"; then ok; else bad "reference run failed: $(tail -3 "$TMP/ref.err")"; fi

# --- 1. a hang inside a launch: exit 6 and the bundle ----------------------------
"$STRATA" train "${BASE[@]}" "${WATCH[@]}" "${HANG[@]}" run.dir="$TMP/hang" >/dev/null 2>"$TMP/hang.err"
code=$?
check "hang_in: exit 6 (got $code)" "[ $code = 6 ]"
check "hang_in: stderr names the op and the bundle" \
  "grep -q 'HANG: LAUNCH block_bwd_res (step plan op [0-9]*, layer [0-9], microbatch 0, device 0, step 3)' '$TMP/hang.err' && grep -q 'hang bundle in $TMP/hang/diag/hang-' '$TMP/hang.err'"
bundle=$(ls -d "$TMP"/hang/diag/hang-* 2>/dev/null | head -1)
check "hang_in: one bundle with hang.json, threads.txt, events.tail.jsonl, maps.txt" \
  "[ -n '$bundle' ] && [ -s '$bundle/hang.json' ] && [ -s '$bundle/threads.txt' ] && [ -s '$bundle/events.tail.jsonl' ] && [ -s '$bundle/maps.txt' ]"
check "hang_in: hang.json names the op, detected within its deadline + 1 s, with ops in flight and the last completed" "$PY - '$bundle/hang.json' <<'EOF'
import json, sys
h = json.load(open(sys.argv[1]))
x = h['expired']
assert (x['phase'], x['kind'], x['name'], x['plan'], x['step'], x['microbatch'], x['device']) == ('op', 'LAUNCH', 'block_bwd_res', 'step', 3, 0, 0), x
assert x['layer'] in (0, 1), x
late = h['detected_at'] - x['issued_at']
assert x['deadline_s'] <= late <= x['deadline_s'] + 1.0, (late, x)
# max(floor 0.5, 10 x the slowest seen of this op in steps 1-2) + 2
assert abs(x['deadline_s'] - (max(0.5, 10 * x['slowest_seen_s']) + 2)) < 1e-5 and x['slowest_seen_s'] > 0, x
names = [a['name'] for a in h['in_flight']]
assert 'block_bwd_res' in names and 'step_3' in names, names
assert all('issued_at' in a and 'deadline_s' in a for a in h['in_flight'])
# an op of step 3, or the checkpoint of step 2 the writer finished meanwhile
last = h['last_completed']
assert last['completed_at'] <= h['detected_at'] and (last.get('step') == 3 or last['phase'] == 'checkpoint_write'), last
lop = h['last_completed_op']
assert lop['phase'] == 'op' and lop['plan'] == 'step' and lop['step'] in (2, 3) and lop['completed_at'] <= h['detected_at'], lop
assert len(h['threads']) >= 2 and sum(t['backtrace'] == 'yes' for t in h['threads']) >= 1
EOF"
check "hang_in: the stuck thread's backtrace runs through the fault inside the executor" \
  "grep -q 'st_faults_in_launch' '$bundle/threads.txt' && grep -q 'st_executor_run' '$bundle/threads.txt'"
check "hang_in: events.jsonl has the fault and the hang; the bundle's tail has the fault" \
  "grep -q '\"fault\": \"hang_in\"' '$TMP/hang/events.jsonl' && grep -q '\"event\": \"hang\"' '$TMP/hang/events.jsonl' && grep -q '\"fault\": \"hang_in\"' '$bundle/events.tail.jsonl'"

# --- 1b. a host hang between ops (hang_at_step) is a hung step ------------------
"$STRATA" train "${BASE[@]}" "${WATCH[@]}" faults.hang_at_step=3 run.dir="$TMP/hstep" >/dev/null 2>"$TMP/hstep.err"
code=$?
check "hang_at_step: exit 6 (got $code), the bundle names step 3" \
  "[ $code = 6 ] && grep -q 'HANG: step step_3 (step 3)' '$TMP/hstep.err' && grep -q '\"summary\": \"step step_3 (step 3)\"' \"\$(ls -d '$TMP'/hstep/diag/hang-*)\"/hang.json"

# --- 2. supervised: restarted after exit 6, completes, identical -----------------
if "$STRATA" run "${BASE[@]}" "${SPIKE[@]}" "${WATCH[@]}" "${HANG[@]}" recovery.backoff_s=0.05 run.dir="$TMP/sup" >/dev/null 2>"$TMP/sup.err"; then ok; else bad "strata run exited $?: $(tail -3 "$TMP/sup.err")"; fi
check "supervised: one incident, exit 6, restarted and recovered" "$PY - '$TMP/sup/recovery.json' <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r['outcome'] == 'completed' and r['restarts'] == 1, r
i = r['incidents'][0]
assert i['exit_code'] == 6 and i['cause'] == 'exit 6 (hang detected by the trainer)' and i['recovered'], i
assert i['hang_bundle'].startswith(sys.argv[1].rsplit('/', 1)[0] + '/diag/hang-'), i
assert i['hang_op'].startswith('LAUNCH block_bwd_res (step plan op ') and i['hang_op'].endswith(', step 3)'), i
EOF"
check "supervised: final parameters and losses identical to the uninterrupted run" "$DRILL same '$TMP/ref' '$TMP/sup' >/dev/null"

# --- 3. a hang_in that could never fire is refused --------------------------------
expect_exit 2 "faults.hang_in=no_such_program: no plan launches a program 'no_such_program'; the step plan's programs: .*block_fwd" \
  train "${BASE[@]}" faults.hang_in=no_such_program run.dir="$TMP/bad1"
expect_exit 2 "faults.hang_in=block_fwd:x: the part after ':' must be a step" \
  train "${BASE[@]}" faults.hang_in=block_fwd:x run.dir="$TMP/bad2"

# --- 4. loss spikes agree with metrics.jsonl -------------------------------------
check "loss_spike events are exactly the steps whose z-score over the last 3 losses exceeds 0.05, with their samples" "$PY - '$TMP/ref' <<'EOF'
import json, math, sys
run = sys.argv[1]
losses = {}
for line in open(run + '/metrics.jsonl'):
    m = json.loads(line)
    if 'loss' in m and 'eval_loss' not in m:
        losses[m['step']] = m['loss']
events = [json.loads(l) for l in open(run + '/events.jsonl')]
spikes = {e['step']: e for e in events if e['event'] == 'loss_spike'}
steps = sorted(losses)
want = {}
for k, s in enumerate(steps):
    win = [losses[p] for p in steps[max(0, k - 3):k]]
    if len(win) < 3:
        continue
    mean = sum(win) / len(win)
    std = math.sqrt(sum((v - mean) ** 2 for v in win) / (len(win) - 1))
    if std > 0 and (losses[s] - mean) / std > 0.05:
        want[s] = (losses[s] - mean) / std
assert want, 'the crafted threshold flags no step: the check would be empty'
assert sorted(want) == sorted(spikes), (want, sorted(spikes))
for s, z in want.items():
    e = spikes[s]
    assert abs(e['z'] - z) < 1e-9 and e['loss'] == losses[s] and e['window'] == 3, (e, z)
    assert e['samples'] == {'stream': 'train', 'first': (s - 1) * 4, 'count': 4, 'indices': list(range((s - 1) * 4, s * 4))}, e
EOF"

finish test_hang.sh
