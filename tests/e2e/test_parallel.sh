#!/usr/bin/env bash
# test_parallel.sh — the parallel.* keys (docs/parallelism.md): every mesh
# rule gives exit 2 with its exact message naming the keys, their values
# and where they were set; a valid mesh passes `strata config`; `strata
# train` refuses parameter offload under fsdp with exit 2, while
# parallel.data > 1 and parallel.fsdp > 1 train (their equivalence with one
# device: tests/py/test_data_parallel.py; FSDP memory and order:
# tests/py/test_fsdp.py; all three axes at once: tests/py/test_tensor_train.py).
# Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d /tmp/strata-e2e-parallel-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

source "$(dirname "$0")/lib.sh"

# expect_error MESSAGE ARGS...: exit 2, exactly "strata: config error:
# MESSAGE" on stderr, nothing on stdout (lib.sh's expect_config_error).
expect_error() {
  local msg=$1
  shift
  expect_config_error "$PWD" 2 "$msg" -- "$@"
}

# --- the rules --------------------------------------------------------------
expect_error "parallel.data x parallel.fsdp x parallel.tensor = 1 x 4 x 1 = 4 devices (configs/base.yml:85, command line, configs/base.yml:87), but runtime.cpu_devices is 2 (configs/base.yml:75)" \
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
  "grep -Eq '^parallel.fsdp +2 +command line' <<<\"\$out\" && grep -Eq '^parallel.tensor +1 +configs/base.yml:87' <<<\"\$out\""
out=$("$STRATA" config --yaml configs/test.yml 2>/dev/null)
check "the YAML snapshot has the parallel section with its defaults" \
  "grep -A3 '^parallel:' <<<\"\$out\" | grep -q '  tensor: 1'"

# --- fsdp with parameter offload: refused by the step plan (st__check_mesh), so `strata plan` does too
for off in params both; do
  expect_error "sched.offload=$off with parallel.fsdp=2: parameter offload is not built for fully-sharded parameters; set sched.offload to none or optimizer" \
    train configs/test.yml parallel.fsdp=2 sched.offload=$off run.dir="$TMP/off_$off"
  expect_error "sched.offload=$off with parallel.fsdp=2: parameter offload is not built for fully-sharded parameters; set sched.offload to none or optimizer" \
    plan configs/test.yml parallel.fsdp=2 sched.offload=$off
done

# --- data parallelism trains --------------------------------------------------------
"$STRATA" train configs/test.yml parallel.data=2 runtime.cpu_devices=4 train.steps=2 "trace.steps=[2]" run.dir="$TMP/dp" \
  >"$TMP/dp.out" 2>"$TMP/dp.err"
code=$?
check "parallel.data=2 trains (exit $code; stderr: $(tail -3 "$TMP/dp.err"))" "[ $code = 0 ]"
check "its metrics count the all-reduces: one per group instance" \
  "grep -q '\"collectives\": 4' '$TMP/dp/metrics.jsonl'"
"$STRATA" train configs/test.yml parallel.data=2 runtime.cpu_devices=4 train.steps=2 sched.wait=eager run.dir="$TMP/dpe" \
  >"$TMP/dpe.out" 2>"$TMP/dpe.err"
code=$?
check "parallel.data=2 with sched.wait=eager trains (exit $code; stderr: $(tail -3 "$TMP/dpe.err"))" "[ $code = 0 ]"
"$STRATA" plan --json configs/test.yml parallel.data=2 runtime.cpu_devices=4 >"$TMP/dp_plan.json" 2>/dev/null || bad "plan --json failed"

# --- fully-sharded data parallelism trains ----------------------------------------------
# On the default 2 CPU devices: with two collectives in flight at once (the
# prefetch issues all-gathers back to back) each could hold one of the
# plugin's threads and wait for the other forever, until XLA aborted after
# 40 s ("Expected 2 threads to join the rendezvous, but only 1 of them
# arrived"); under fsdp the executor issues a collective only once the SPMD
# op before it has completed (st_plan.serialize_spmd; docs/parallelism.md,
# "FSDP in the plan").
FSDP=(configs/test.yml parallel.fsdp=2 train.steps=2 sched.gather_prefetch=1)
"$STRATA" train "${FSDP[@]}" "trace.steps=[2]" run.dir="$TMP/fsdp" >"$TMP/fsdp.out" 2>"$TMP/fsdp.err"
code=$?
check "parallel.fsdp=2 trains (exit $code; stderr: $(tail -3 "$TMP/fsdp.err"))" "[ $code = 0 ]"
"$STRATA" train "${FSDP[@]}" sched.wait=eager run.dir="$TMP/fsdpe" >"$TMP/fsdpe.out" 2>"$TMP/fsdpe.err"
code=$?
check "parallel.fsdp=2 with sched.wait=eager trains (exit $code; stderr: $(tail -3 "$TMP/fsdpe.err"))" "[ $code = 0 ]"
"$STRATA" plan --json "${FSDP[@]}" >"$TMP/fsdp_plan.json" 2>/dev/null || bad "plan --json (fsdp) failed"
check "its metrics count the plan's all-gathers and reduce-scatters: one reduce-scatter per group instance and microbatch" "$PY - '$TMP/fsdp/metrics.jsonl' '$TMP/fsdp_plan.json' <<'PYEOF'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '\"loss\"' in l]
ops = json.load(open(sys.argv[2]))['step']['ops']
progs = [o['program'] for o in ops if o['kind'] == 'COLLECTIVE']
rs = [p for p in progs if p.endswith('_fsdp_reduce_scatter')]
ag = [p for p in progs if p.endswith('_fsdp_all_gather')]
assert len(rs) == 4 * 2 and len(ag) + len(rs) == len(progs), progs  # 4 instances x 2 microbatches
for m in steps:
    assert m['devices'] == 2 and m['collectives'] == len(progs), (m['collectives'], len(progs))
print(f'# fsdp=2: {len(ag)} all-gathers and {len(rs)} reduce-scatters a step')
PYEOF"

# The trace of a data-parallel step: a compute and a communication track per
# device (docs/scheduling.md section 6), every launch on each device's compute
# track, every collective on each device's communication track, consistent times.
for c in dp fsdp; do
check "$c: trace: a compute and a communication track per device, every launch and collective on each" "$PY - '$TMP/$c/trace/step_2.json' '$TMP/${c}_plan.json' $c <<'PYEOF'
import json, sys
trace = json.load(open(sys.argv[1]))
ops = json.load(open(sys.argv[2]))['step']['ops']
ev = trace['traceEvents']
tracks = {e['tid']: e['args']['name'] for e in ev if e['ph'] == 'M' and e['name'] == 'thread_name'}
names = set(tracks.values())
assert trace['otherData']['devices'] == [0, 1], trace['otherData']
for d in (0, 1):
    assert f'device {d} compute' in names and f'device {d} communication' in names, names
assert 'launches' not in names and 'collectives' not in names, names
seen = {}
for e in ev:
    if e['ph'] != 'X':
        continue
    a = e['args']
    seen.setdefault(a['op'], []).append((tracks[e['tid']], a.get('device'), e))
eps = 1e-3
for i, op in enumerate(ops):
    got = seen.get(i, [])
    k = op['kind']
    if k in ('LAUNCH', 'RECOMPUTE', 'COLLECTIVE'):
        want = 'compute' if k != 'COLLECTIVE' else 'communication'
        assert sorted(d for _, d, _ in got) == [0, 1], (i, k, [(t, d) for t, d, _ in got])
        for t, d, e in got:
            assert t == f'device {d} {want}' or t.startswith(f'device {d} {want} (concurrent'), (i, k, t, d)
            a = e['args']
            assert e['name'] == op['program'] and a['kind'] == k and a['deps'] == op['deps'], (i, e)
            st, co = a['device_start_us'], a['device_complete_us']
            assert a['issue_us'] <= st + eps and st <= co + eps and co <= a['complete_us'] + eps, (i, a)
            assert abs(e['ts'] - st) <= eps and abs(e['ts'] + e['dur'] - co) <= 2 * eps, (i, e)
            for dep in op['deps']:  # a device's part starts after the deps' parts on the same device
                for _, dd, de in seen[dep]:
                    if dd in (None, d):
                        done = de['args'].get('device_complete_us', de['args']['complete_us'])
                        assert st + eps >= done, (i, d, st, dep, done)
        if k == 'COLLECTIVE':
            assert all(e['args']['bytes'] > 0 and e['args']['devices'] == 2 for _, _, e in got)
    else:
        assert len(got) == 1 and got[0][1] is None, (i, k, got)
lanes = {}
for e in ev:
    if e['ph'] == 'X':
        lanes.setdefault(e['tid'], []).append((e['ts'], e['ts'] + e['dur']))
for tid, iv in lanes.items():
    iv.sort()
    for (a0, a1), (b0, b1) in zip(iv, iv[1:]):
        assert b0 + eps >= a1, (tracks[tid], a0, a1, b0, b1)
n_l = sum(op['kind'] in ('LAUNCH', 'RECOMPUTE') for op in ops)
n_c = sum(op['kind'] == 'COLLECTIVE' for op in ops)
print(f'# {sys.argv[3]} trace: {n_l} launches and {n_c} collectives on each of 2 devices')
PYEOF"
done

# Unhidden communication wait and per-device peaks by category (docs/scheduling.md section 5).
check "data=2 and fsdp=2 metrics: comm_wait_s within collective_s, predicted = accounted peak by category and per op, deferred and eager" "$PY - '$TMP/dp/metrics.jsonl' '$TMP/dpe/metrics.jsonl' '$TMP/fsdp/metrics.jsonl' '$TMP/fsdpe/metrics.jsonl' <<'PYEOF'
import json, sys
for path in sys.argv[1:]:
    steps = [json.loads(l) for l in open(path) if '\"loss\"' in l]
    assert len(steps) == 2, path
    for m in steps:
        assert 0 <= m['comm_wait_s'] <= m['collective_s'] + 1e-6, m
        assert isinstance(m['comm_waits'], int) and m['comm_waits'] >= 0, m
        assert (m['comm_waits'] == 0) == (m['comm_wait_s'] == 0), m
        assert m['peak_live_by_category_predicted'] == m['peak_live_by_category'], m
        assert sum(m['peak_live_by_category'].values()) == m['peak_live_bytes'] == m['peak_live_bytes_predicted'], m
        assert m['live_mismatch_op'] == -1, m
    print(f'# {path}: comm_wait_s', [m['comm_wait_s'] for m in steps], 'of collective_s', [m['collective_s'] for m in steps],
          'overlap', [m['comm_overlap_ratio'] for m in steps])
PYEOF"
out=$("$STRATA" plan configs/test.yml parallel.data=2 runtime.cpu_devices=4 2>/dev/null)
check "strata plan shows the COLLECTIVE ops and the policy" \
  "grep -Eq 'COLLECTIVE +block_data_all_reduce layer=1' <<<\"\$out\" && grep -q 'data=2 grad_reduce=per_layer' <<<\"\$out\""
expect_error "sched.optimizer=per_layer (command line) updates each layer as soon as its gradient is reduced, so with parallel.data=2 (command line) it needs sched.grad_reduce=per_layer, not bucketed (command line)" \
  config configs/test.yml parallel.data=2 runtime.cpu_devices=4 sched.optimizer=per_layer train.grad_clip=0 sched.grad_reduce=bucketed

finish test_parallel.sh
