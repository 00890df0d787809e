#!/usr/bin/env bash
# test_sched.sh — the scheduler end to end (docs/scheduling.md), on the real
# exporter and CPU plugin:
#   1. the equivalence matrix: policy combinations (remat none/full/
#      every:2 x offload none/optimizer/params/both x prefetch 0/1/2 x wait
#      eager/deferred x optimizer after_backward/per_layer) trains 10 steps (24 in make test, all 144 with STRATA_TEST_FULL=1);
#      its losses and eval losses must equal the base plan's (sched.remat=full,
#      every other policy at its default): bitwise when the remat choice is
#      the base's (the same programs run on the same values; only issue
#      order, waits and copies differ), within 1e-6 when it is not (block_fwd
#      and block_fwd_res are different XLA programs and may round y
#      differently in the last bit). per_layer needs train.grad_clip=0, so
#      those runs compare with the base plan at grad_clip=0. Every run's
#      accounted live bytes must match the plan's prediction at every op.
#      The default, sched.remat=auto with no memory budget, must train
#      exactly as remat=none (its plan is none's).
#   2. a written trace parsed against the plan: every op once, consistent
#      timestamps, the four tracks, live-byte counters.
#   3. `strata plan` text and JSON with the new ops; config errors.
# All runs share one bundle and executable cache (about 0.3 s per run).
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d /tmp/strata-e2e-sched-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# The cache of the whole make test when run_all.sh shares one (tests/README.md, "Time"); alone, a private one.
[ "${STRATA_E2E_SHARED_CACHE:-0}" = 1 ] || export STRATA_CACHE_DIR="$TMP/cache"

source "$(dirname "$0")/lib.sh"

BASE=(configs/test.yml runtime.deterministic=true runtime.cpu_devices=1 run.progress=off)

# --- 1. the equivalence matrix ---------------------------------------------------
train() { # DIR OVERRIDES...
  local dir=$1
  shift
  if ! "$STRATA" train "${BASE[@]}" run.dir="$dir" "$@" >/dev/null 2>"$dir.err"; then
    bad "train $*: exit $?: $(tail -3 "$dir.err")"
    return 1
  fi
}
t0=$(date +%s)
mkdir -p "$TMP/m"
train "$TMP/m/base-clip" sched.remat=full || true
train "$TMP/m/base-noclip" sched.remat=full train.grad_clip=0 || true
train "$TMP/m/auto-default" || true
# make test trains 24 of the 144: every optimizer x remat x offload
# combination, each with one of the six prefetch x wait pairs in turn, so
# every value of every policy and every pair of optimizer, remat and
# offload is trained; STRATA_TEST_FULL=1 (make test-long) trains all 144.
FULL=${STRATA_TEST_FULL:-0}
PAIRS=("1 deferred" "0 eager" "2 deferred" "1 eager" "0 deferred" "2 eager")
n=0
c=0
for opt in after_backward per_layer; do
  clip=()
  [ "$opt" = per_layer ] && clip=(train.grad_clip=0)
  for remat in none full every:2; do
    for off in none optimizer params both; do
      pick=${PAIRS[$((c % 6))]}
      c=$((c + 1))
      for pf in 0 1 2; do
        for wait in eager deferred; do
          [ "$FULL" = 1 ] || [ "$pf $wait" = "$pick" ] || continue
          n=$((n + 1))
          d="$TMP/m/$opt.$remat.$off.$pf.$wait"
          train "$d" sched.optimizer=$opt sched.remat=$remat sched.offload=$off sched.prefetch_depth=$pf \
            sched.wait=$wait "${clip[@]}" || true
        done
      done
    done
  done
done
echo "# equivalence matrix: $n combinations trained in $(($(date +%s) - t0)) s"
check "equivalence matrix: losses equal the default plan's, accounting matches the plan" "$PY - '$TMP/m' $n <<'PYEOF'
import glob, json, os, sys
root, want_runs = sys.argv[1], int(sys.argv[2])

def read(d):
    steps, evals = [], []
    for line in open(os.path.join(d, 'metrics.jsonl')):
        m = json.loads(line)
        if 'loss' in m:
            steps.append(m)
        elif 'eval_loss' in m:
            evals.append(m['eval_loss'])
    return steps, evals

base = {'after_backward': read(os.path.join(root, 'base-clip')), 'per_layer': read(os.path.join(root, 'base-noclip'))}
runs = sorted(d for d in glob.glob(os.path.join(root, '*.*.*.*.*')) if os.path.isdir(d))
assert len(runs) == want_runs and want_runs in (24, 144), (len(runs), want_runs)
bad, bitwise, worst = [], 0, 0.0
for d in runs:
    opt, remat, off, pf, wait = os.path.basename(d).split('.', 4)
    steps, evals = read(d)
    b_steps, b_evals = base[opt]
    got = [m['loss'] for m in steps] + evals
    want = [m['loss'] for m in b_steps] + b_evals
    if len(steps) != 10 or len(got) != len(want):
        bad.append(f'{d}: {len(steps)} steps, {len(got)} values')
        continue
    diff = max(abs(a - b) for a, b in zip(got, want))
    if diff == 0:
        bitwise += 1
    if remat == 'full' and diff != 0:
        bad.append(f'{os.path.basename(d)}: same programs as the default plan but not bitwise equal (max diff {diff:.3g})')
    if diff > 1e-6:
        bad.append(f'{os.path.basename(d)}: max loss difference {diff:.3g} > 1e-6')
    if remat != 'full':
        worst = max(worst, diff)
    for m in steps:
        if m['live_mismatch_op'] != -1 or m['peak_live_bytes'] != m['peak_live_bytes_predicted']:
            bad.append(f'{os.path.basename(d)} step {m[\"step\"]}: accounted live bytes differ from the plan')
            break
        # XLA's temporaries of the running program on top (issue 18): accounted = predicted, and above the slots alone
        if m['peak_with_temps_bytes'] != m['peak_with_temps_bytes_predicted'] or m['peak_with_temps_bytes'] <= m['peak_live_bytes'] or m['peak_temps_bytes'] <= 0:
            bad.append(f'{os.path.basename(d)} step {m[\"step\"]}: peak with temporaries {m[\"peak_with_temps_bytes\"]} (predicted {m[\"peak_with_temps_bytes_predicted\"]}, slots {m[\"peak_live_bytes\"]})')
            break
    if off != 'none' and steps[0]['host_bytes'] <= 0:
        bad.append(f'{os.path.basename(d)}: offload {off} but no host bytes')
    if wait == 'eager' and steps[0]['waits'] <= steps[0]['launches']:
        bad.append(f'{os.path.basename(d)}: eager but only {steps[0][\"waits\"]} waits for {steps[0][\"launches\"]} launches')
# The default (auto, no budget) is none's plan: the very same losses.
auto = read(os.path.join(root, 'auto-default'))
same = read(os.path.join(root, 'after_backward.none.none.1.deferred'))
if [m['loss'] for m in auto[0]] + auto[1] != [m['loss'] for m in same[0]] + same[1] or auto[0][0]['recomputes'] != 0:
    bad.append('auto-default: not bitwise equal to remat=none, or recomputes')
print(f'# {len(runs)} combinations: {bitwise} bitwise equal to the base plan (remat=full); remat none/every:2 max |diff| {worst:.3g} (bound 1e-6); auto (default) = none bitwise')
for b in bad[:20]:
    print('  ' + b)
sys.exit(1 if bad else 0)
PYEOF"
check "auto's choice in the plan event: none, no budget, fits, why" "grep '\"event\": \"plan\"' '$TMP/m/auto-default/events.jsonl' | $PY -c '
import json, sys
e = json.loads(sys.stdin.read())
assert e[\"policy\"].startswith(\"remat=auto:none memory_budget=0 offload=none\"), e[\"policy\"]
r = e[\"remat\"]
assert r[\"mode\"] == \"auto\" and r[\"recompute\"] == [] and r[\"fits\"] and r[\"budget_bytes\"] == 0, r
assert r[\"predicted_peak_bytes\"] == r[\"none_peak_bytes\"] == e[\"predicted_peak_bytes\"], r
assert r[\"why\"] == \"no budget (sched.memory_budget=0): every layer keeps its residuals, predicted peak %d B\" % r[\"none_peak_bytes\"], r
'"
check "policies recorded: resolved config and the plan event" "grep -q 'remat: \"every:2\"' '$TMP/m/per_layer.every:2.both.2.eager/config.yaml' && grep '\"event\": \"plan\"' '$TMP/m/per_layer.every:2.both.2.eager/events.jsonl' | grep -q 'remat=every:2 offload=both prefetch_depth=2 wait=eager optimizer=per_layer'"

# --- 2. a trace, parsed against the plan ---------------------------------------------
TRACE_POL=(sched.remat=every:2 sched.offload=both sched.prefetch_depth=1 sched.optimizer=per_layer train.grad_clip=0)
train "$TMP/tr" "${TRACE_POL[@]}" "trace.steps=[2, 3]" || true
"$STRATA" plan --json "${BASE[@]}" "${TRACE_POL[@]}" >"$TMP/plan.json" 2>/dev/null || bad "plan --json failed"
check "trace files and events for steps 2 and 3 only" "[ -s '$TMP/tr/trace/step_2.json' ] && [ -s '$TMP/tr/trace/step_3.json' ] && [ \$(ls '$TMP/tr/trace' | wc -l) = 2 ] && [ \$(grep -c '\"event\": \"trace\"' '$TMP/tr/events.jsonl') = 2 ]"
check "trace: every plan op once, consistent timestamps, tracks and counters" "$PY - '$TMP/tr/trace/step_2.json' '$TMP/plan.json' <<'PYEOF'
import json, sys
trace = json.load(open(sys.argv[1]))
plan = json.load(open(sys.argv[2]))['step']
ops = plan['ops']
ev = trace['traceEvents']
assert isinstance(ev, list) and trace['displayTimeUnit'] == 'ms'
for e in ev:
    assert e['ph'] in ('X', 'C', 'M') and isinstance(e['pid'], int), e
    if e['ph'] != 'M':
        assert isinstance(e['ts'], (int, float)) and e['ts'] >= 0, e
tracks = {e['tid']: e['args']['name'] for e in ev if e['ph'] == 'M' and e['name'] == 'thread_name'}
for want in ('launches', 'transfers', 'host waits', 'host ops'):
    assert want in tracks.values(), (want, tracks)
xs = [e for e in ev if e['ph'] == 'X']
by_op = {}
for e in xs:
    i = e['args']['op']
    assert i not in by_op, f'op {i} appears twice'
    by_op[i] = e
assert sorted(by_op) == list(range(len(ops))), f'{len(by_op)} ops in the trace, {len(ops)} in the plan'
track_of = {'LAUNCH': 'launches', 'RECOMPUTE': 'launches', 'H2D': 'transfers', 'D2H': 'transfers',
            'WAIT': 'host waits', 'READ': 'host waits', 'HOST': 'host ops', 'FREE': 'host ops'}
eps = 1e-3  # microseconds: timestamps are printed with 3 decimals
prev_issue = -1.0
for i, op in enumerate(ops):
    e = by_op[i]
    a = e['args']
    assert a['kind'] == op['kind'] and a['layer'] == op['layer'] and a['micro'] == op['micro'], (i, a, op)
    assert a['deps'] == op['deps'], (i, a['deps'], op['deps'])
    assert tracks[e['tid']].startswith(track_of[op['kind']]), (i, tracks[e['tid']], op['kind'])
    if op['kind'] in ('LAUNCH', 'RECOMPUTE'):
        assert e['name'] == op['program'], (e['name'], op['program'])
    iss, st, co = a['issue_us'], a['start_us'], a['complete_us']
    assert iss + eps >= prev_issue, f'op {i} issued before op {i - 1}'
    prev_issue = iss
    assert iss <= st + eps and st <= co + eps, (i, iss, st, co)
    dev = op['kind'] in ('LAUNCH', 'RECOMPUTE', 'H2D', 'D2H')
    assert abs(e['ts'] - (st if dev else iss)) <= eps, (i, e['ts'], st, iss)
    assert abs(e['ts'] + e['dur'] - co) <= 2 * eps, (i, e['ts'], e['dur'], co)
    for d in op['deps']:
        done = by_op[d]['args']['complete_us']
        if dev:
            assert st + eps >= done, f'op {i} starts at {st} before its dep {d} completes at {done}'
        if op['kind'] in ('WAIT', 'READ'):
            assert co + eps >= done, f'{op[\"kind\"]} {i} ends at {co} before its dep {d} completes at {done}'
    if op['kind'] == 'WAIT':
        assert isinstance(a['blocked'], bool)
    if op['kind'] in ('H2D', 'D2H'):
        assert a['bytes'] > 0
# Perfetto drops misnested slices: on every track they must be disjoint
lanes = {}
for e in xs:
    lanes.setdefault(e['tid'], []).append((e['ts'], e['ts'] + e['dur']))
for tid, iv in lanes.items():
    iv.sort()
    for (a0, a1), (b0, b1) in zip(iv, iv[1:]):
        assert b0 + eps >= a1, f'track {tracks[tid]}: slices [{a0}, {a1}] and [{b0}, {b1}] overlap'
# counters: accounted live bytes after every op equal the plan's prediction
live = [e for e in ev if e['ph'] == 'C' and e['name'] == 'live device bytes']
pred = [e for e in ev if e['ph'] == 'C' and e['name'] == 'predicted live device bytes']
assert len(live) == len(ops) and len(pred) == len(ops)
for i, (c, p) in enumerate(zip(live, pred)):
    assert c['args'] == ops[i]['live_bytes'], (i, c['args'], ops[i]['live_bytes'])
    assert p['args']['bytes'] == sum(ops[i]['live_bytes'].values())
meta = trace['otherData']
assert meta['step'] == 2 and meta['op_count'] == len(ops) and meta['host_memory'] in ('pinned_host', 'unpinned_host')
assert meta['predicted_peak_bytes'] == plan['predicted_peak_bytes'] == meta['peak_live_bytes'], meta
kinds = {op['kind'] for op in ops}
assert kinds >= {'LAUNCH', 'RECOMPUTE', 'H2D', 'D2H', 'WAIT', 'READ', 'HOST', 'FREE'}, kinds
print(f'# trace: {len(ops)} ops on {len(tracks)} tracks, every op once, timestamps consistent')
PYEOF"

# --- 3. strata plan with the new ops; config errors --------------------------------
# --compile: XLA's temporaries per program, and the peak that includes them
# equals what the default run (same config) predicted and accounted.
"$STRATA" plan --compile --json "${BASE[@]}" >"$TMP/plan-temps.json" 2>"$TMP/err" || bad "plan --compile exited $?: $(tail -3 "$TMP/err")"
"$STRATA" plan --compile "${BASE[@]}" >"$TMP/plan-temps.txt" 2>/dev/null
check "plan --compile: block programs' temporaries > 0, the accounted peak includes them, = the run's" "grep -q '^# temporaries per program (bytes per device):.* block_fwd_res=[1-9]' '$TMP/plan-temps.txt' && grep -Eq '^ +[0-9]+ LAUNCH +block_bwd_res .* temp=[1-9][0-9]*$' '$TMP/plan-temps.txt' && $PY - '$TMP/plan-temps.json' '$TMP/m/auto-default' <<'PYEOF'
import json, os, sys
p = json.load(open(sys.argv[1]))['step']
t = p['program_temp_bytes']
assert all(t[k] > 0 for k in ('block_fwd_res', 'block_bwd_res', 'head_loss')), t
# the peak with temporaries is the most, over ops, of live slots + the running program's temporaries
best = max(sum(op['live_bytes'].values()) + (t[op['program']] if op['kind'] in ('LAUNCH', 'RECOMPUTE') else 0) for op in p['ops'])
assert p['predicted_peak_with_temps_bytes'] == best > p['predicted_peak_bytes'], (p['predicted_peak_with_temps_bytes'], best, p['predicted_peak_bytes'])
ev = [json.loads(l) for l in open(os.path.join(sys.argv[2], 'events.jsonl'))]
plan_ev = [e for e in ev if e['event'] == 'plan'][0]
assert plan_ev['predicted_peak_with_temps_bytes'] == best and plan_ev['program_temp_bytes'] == t, plan_ev
m = [json.loads(l) for l in open(os.path.join(sys.argv[2], 'metrics.jsonl'))]
m = [x for x in m if 'loss' in x]
assert all(x['peak_with_temps_bytes'] == x['peak_with_temps_bytes_predicted'] == best for x in m), [x['peak_with_temps_bytes'] for x in m]
fr, br, hl, sl = t['block_fwd_res'], t['block_bwd_res'], t['head_loss'], p['predicted_peak_bytes']
print(f'# temporaries: block_fwd_res {fr} B, block_bwd_res {br} B, head_loss {hl} B; peak {sl} -> {best} B with them')
PYEOF"
if "$STRATA" plan "${BASE[@]}" "${TRACE_POL[@]}" sched.wait=eager >"$TMP/plan.txt" 2>"$TMP/err"; then ok; else bad "plan exited $?"; fi
check "plan text shows policies, recompute, offload transfers, waits, deps" "grep -q '# policy: remat=every:2 offload=both prefetch_depth=1 wait=eager optimizer=per_layer' '$TMP/plan.txt' && grep -Eq 'RECOMPUTE +block_fwd_res layer=0' '$TMP/plan.txt' && grep -Eq 'H2D .*in=\[host:m:layers.1.wq' '$TMP/plan.txt' && grep -Eq 'D2H .*out=\[host:layers.0.wq\]' '$TMP/plan.txt' && grep -Eq 'WAIT .* deps=\[' '$TMP/plan.txt' && grep -Eq 'host-memory bytes [1-9]' '$TMP/plan.txt'"
check "plan JSON: live bytes per op by category, host slots, peak = max" "$PY - '$TMP/plan.json' <<'PYEOF'
import json, sys
p = json.load(open(sys.argv[1]))['step']
cats = ['params', 'grads', 'optimizer', 'activations', 'transfer', 'gathered', 'unreduced']
assert all(list(op['live_bytes']) == cats and 'deps' in op for op in p['ops'])
# gathered parameters and unreduced gradients exist only under parallel.fsdp > 1
assert all(op['live_bytes']['gathered'] == op['live_bytes']['unreduced'] == 0 for op in p['ops'])
assert list(p['predicted_peak_by_category']) == cats
start = sum(s['bytes'] for s in p['slots'] if s['persistent'] and s['memory'] == 'device')
peak = max([start] + [sum(op['live_bytes'].values()) for op in p['ops']])
assert peak == p['predicted_peak_bytes'], (peak, p['predicted_peak_bytes'])
hosts = [s for s in p['slots'] if s['memory'] == 'host']
assert hosts and all(s['persistent'] and p['slots'][s['twin']]['twin'] == p['slots'].index(s) for s in hosts)
assert p['host_bytes'] == sum(s['bytes'] for s in hosts)
PYEOF"
expect_exit 2 "sched.optimizer=per_layer .*train.grad_clip is 1" config "${BASE[@]}" sched.optimizer=per_layer
expect_exit 2 "sched.remat 'every:0': K must be a whole number >= 1" config "${BASE[@]}" sched.remat=every:0
expect_exit 2 "sched.remat '1,5' lists layer 5, but the model has 2 layers" config "${BASE[@]}" sched.remat=1,5
expect_exit 2 "sched.offload" config "${BASE[@]}" sched.offload=gpu
# A fraction needs the device memory, which the CPU plugin does not report.
FRACTION_ERR="sched.memory_budget '0.9' (command line) is a fraction of the device's memory, but the PJRT plugin does not report its devices' memory (PJRT_Device_MemoryStats gives no bytes_limit); give the budget in bytes, e.g. sched.memory_budget=1000000000"
expect_config_error "$PWD" 2 "$FRACTION_ERR" -- plan "${BASE[@]}" sched.memory_budget=0.9
expect_config_error "$PWD" 2 "$FRACTION_ERR" -- train "${BASE[@]}" run.dir="$TMP/fraction" sched.memory_budget=0.9
if "$STRATA" plan "${BASE[@]}" sched.remat=full sched.memory_budget=0.9 >/dev/null 2>&1; then ok; else bad "sched.remat=full with a fractional budget (unused) was refused"; fi

# sched.remat=auto in strata plan: a budget between none's and full's peaks
# recomputes some layers, a tiny one all of them and says it does not fit.
"$STRATA" plan --json "${BASE[@]}" sched.remat=none >"$TMP/none.json" 2>/dev/null
"$STRATA" plan --json "${BASE[@]}" sched.remat=full >"$TMP/full.json" 2>/dev/null
NONE_PEAK=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"]["predicted_peak_bytes"])' "$TMP/none.json")
FULL_PEAK=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"]["predicted_peak_bytes"])' "$TMP/full.json")
"$STRATA" plan "${BASE[@]}" sched.memory_budget=$((NONE_PEAK - 1)) >"$TMP/auto-mid.txt" 2>&1
check "plan, auto between none ($NONE_PEAK B) and full ($FULL_PEAK B): layer 0 recomputed, the why and the policy" "grep -qx '# remat auto: recompute 1 of 2 layers (0): predicted peak [0-9]* B <= budget $((NONE_PEAK - 1)) B (without remat $NONE_PEAK B, over it)' '$TMP/auto-mid.txt' && grep -q '^# policy: remat=auto:0 memory_budget=$((NONE_PEAK - 1)) offload=none' '$TMP/auto-mid.txt' && grep -Eq 'RECOMPUTE +block_fwd_res layer=0' '$TMP/auto-mid.txt' && ! grep -Eq 'RECOMPUTE +block_fwd_res layer=1' '$TMP/auto-mid.txt'"
"$STRATA" plan "${BASE[@]}" sched.memory_budget=1000 >"$TMP/auto-tiny.txt" 2>&1
check "plan, auto with a tiny budget: full, and it says it does not fit" "grep -qx '# remat auto: does not fit: even with every layer recomputed the predicted peak is $FULL_PEAK B > budget 1000 B (without remat $NONE_PEAK B); chose full' '$TMP/auto-tiny.txt' && grep -q '^# policy: remat=auto:full memory_budget=1000 ' '$TMP/auto-tiny.txt' && [ \$(grep -Ec '^ *[0-9]+ RECOMPUTE' '$TMP/auto-tiny.txt') = 4 ]"

# --- will it fit (issue 18): the peak with temporaries against the device's memory
LIMIT=$($PY -c "import json; print(json.load(open('$TMP/plan-temps.json'))['step']['predicted_peak_with_temps_bytes'] - 1)")
"$STRATA" plan --fit "${BASE[@]}" runtime.device_memory_bytes=$LIMIT >"$TMP/fit.out" 2>"$TMP/fit.err"
rc=$?
check "plan --fit, one byte too little device memory: exit 4 naming the predicted peak, the limit and sched.remat=full" "[ $rc = 4 ] && grep -q 'predicted peak $((LIMIT + 1)) B (live buffers + XLA.s temporaries) > device memory $LIMIT B (runtime.device_memory_bytes)' '$TMP/fit.err' && grep -Eq 'Policies that fit: sched.remat=full \(predicted peak [0-9]+ B\)' '$TMP/fit.err' && grep -q '^# fit: DOES NOT FIT' '$TMP/fit.out'"
"$STRATA" plan --fit "${BASE[@]}" runtime.device_memory_bytes=$LIMIT sched.remat=full >"$TMP/fit2.out" 2>&1
rc=$?
check "plan --fit with the advised sched.remat=full: fits, exit 0" "[ $rc = 0 ] && grep -q '^# fit: fits: [0-9]* <= $LIMIT bytes' '$TMP/fit2.out'"
"$STRATA" train "${BASE[@]}" train.steps=2 runtime.device_memory_bytes=$LIMIT run.dir="$TMP/nofit" >/dev/null 2>"$TMP/nofit.err"
rc=$?
check "train too large for its stated memory: exit 4 before any step, with the advice" "[ $rc = 4 ] && grep -q 'predicted not to fit' '$TMP/nofit.err' && grep -q 'sched.remat=full' '$TMP/nofit.err' && ! grep -q '\"loss\"' '$TMP/nofit/metrics.jsonl' 2>/dev/null"
"$STRATA" train "${BASE[@]}" train.steps=2 runtime.device_memory_bytes=$LIMIT sched.allow_overcommit=true run.dir="$TMP/overcommit" >/dev/null 2>"$TMP/over.err"
rc=$?
check "... with sched.allow_overcommit=true it trains, warning, and the fit event says so" "[ $rc = 0 ] && grep -q 'going on' '$TMP/over.err' && grep '\"event\": \"fit\"' '$TMP/overcommit/events.jsonl' | grep -q '\"fits\": false'"
expect_exit 2 "sched.prefetch_depth" config "${BASE[@]}" sched.prefetch_depth=-1
expect_exit 2 "trace.steps .*lists step 11, but train.steps is 10" config "${BASE[@]}" "trace.steps=[2, 11]"
expect_exit 2 "trace.steps .*item 1 is 'x'" config "${BASE[@]}" "trace.steps=[x]"

finish test_sched.sh
