#!/usr/bin/env bash
# test_explain.sh — `strata plan --explain` (docs/parallelism.md, "strata plan
# --explain"): the exact text for configs/test.yml on parallel.data=2, on
# one device and on parallel.fsdp=2, and the --json form (those and data=2 x
# fsdp=2) checked against the plan itself (every slot
# listed, peaks equal to the plan's prediction) and against the bundle's
# manifest (each collective's message and ring bytes per device). Also: the
# one-device `strata plan` text is not touched by --explain. Run from the
# repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d /tmp/strata-e2e-explain-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

source "$(dirname "$0")/lib.sh"

# exact CASE ARGS...: `strata plan --explain ARGS` prints $TMP/CASE.want
# after its "# bundle <dir>" line (the directory depends on the cache).
exact() {
  local name=$1
  shift
  "$STRATA" plan --explain "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  local code=$?
  if [ "$code" != 0 ]; then
    bad "plan --explain $*: exit $code: $(tail -3 "$TMP/$name.err")"
  elif ! head -1 "$TMP/$name.out" | grep -q '^# bundle /'; then
    bad "plan --explain $*: first line is not the bundle: $(head -1 "$TMP/$name.out")"
  elif ! diff <(sed 1d "$TMP/$name.out") "$TMP/$name.want" >"$TMP/$name.diff"; then
    bad "plan --explain $*: differs from the expected text (< got, > want):
$(cat "$TMP/$name.diff")"
  else
    ok
  fi
}

cat >"$TMP/data2.want" <<'WANT'
# mesh: data=2 fsdp=1 tensor=1: 2 devices (runtime devices 0 1); data groups [[0 1]]
# policy: remat=full offload=none prefetch_depth=1 wait=deferred optimizer=after_backward data=2 grad_reduce=per_layer
# tensors: 138 (grouped: '*' is any number, 'layers.*.*' every block parameter of every layer, 'res[*].*' every residual; --json lists each)
  category     memory tensors                  count bytes/device  type/device        sharding
  params       device wte                          1        32768  f32[256,32]        replicated over data
  params       device layers.*.*                  18        82432  (various)          replicated over data
  params       device final_norm                   1          128  f32[32]            replicated over data
  grads        device grad:final_norm              1          128  f32[32]            partial over data (sum over devices until all-reduced)
  grads        device hgrad:wte                    1        32768  f32[256,32]        partial over data (sum over devices until all-reduced)
  grads        device grad:layers.*.*             18        82432  (various)          partial over data (sum over devices until all-reduced)
  grads        device grad:wte                     1        32768  f32[256,32]        partial over data (sum over devices until all-reduced)
  grads        device gtmp:final_norm              1          128  f32[32]            partial over data (sum over devices until all-reduced)
  grads        device gtmp:layers.*.*             18        82432  (various)          partial over data (sum over devices until all-reduced)
  grads        device gtmp:wte                     1        32768  f32[256,32]        partial over data (sum over devices until all-reduced)
  optimizer    device m:wte                        1        32768  f32[256,32]        replicated over data
  optimizer    device v:wte                        1        32768  f32[256,32]        replicated over data
  optimizer    device m:layers.*.*                18        82432  (various)          replicated over data
  optimizer    device v:layers.*.*                18        82432  (various)          replicated over data
  optimizer    device m:final_norm                 1          128  f32[32]            replicated over data
  optimizer    device v:final_norm                 1          128  f32[32]            replicated over data
  activations  device x[*]                         3         6144  f32[1,16,32]       split over data (dim 0)
  activations  device dx                           1         2048  f32[1,16,32]       split over data (dim 0)
  activations  device res[*].*                    16        37120  (various)          split over data (dim 0)
  activations  device y_re                         1         2048  f32[1,16,32]       split over data (dim 0)
  transfer     device tokens[*]                    2          128  s32[1,16]          split over data (dim 0)
  transfer     device targets[*]                   2          128  s32[1,16]          split over data (dim 0)
  transfer     device mask[*]                      2          128  f32[1,16]          split over data (dim 0)
  transfer     device loss[*]                      2            8  f32[]              one per device (data)
  transfer     device sq[*]                        4           16  f32[]              replicated over data
  transfer     device step                         1            4  f32[]              replicated over data
  transfer     device lr                           1            4  f32[]              replicated over data
  transfer     device gscale                       1            4  f32[]              replicated over data
  transfer     device hyper                        1           16  f32[4]             replicated over data
# collectives per layer, in plan order (bytes per device: the message, and what a ring sends)
  op   30 head      head_data_all_reduce       all_reduce over data     1 tensors        128 B  wire        128 B
  op   37 layer 1   block_data_all_reduce      all_reduce over data     9 tensors      41216 B  wire      41216 B
  op   44 layer 0   block_data_all_reduce      all_reduce over data     9 tensors      41216 B  wire      41216 B
  op   51 embed     embed_data_all_reduce      all_reduce over data     1 tensors      32768 B  wire      32768 B
# communication per step: 4 collectives, 115328 B per device (message), 115328 B sent per device, 230656 B over all devices
# predicted memory per device, bytes
                                   params        grads    optimizer  activations     transfer        total
  persistent state                 115328            0       230656            0            0       345984
  training step peak               115328       189312       230656        24704           72       560072
  evaluation peak                  115328            0            0         4096          128       119552
  host memory (offloaded homes): 0
WANT
# The texts are of full remat's plans (y_re, its collectives' op numbers).
exact data2 configs/test.yml parallel.data=2 runtime.cpu_devices=4 sched.remat=full

cat >"$TMP/one.want" <<'WANT'
# mesh: data=1 fsdp=1 tensor=1: 1 device (runtime device 0)
# policy: remat=full offload=none prefetch_depth=1 wait=deferred optimizer=after_backward
# tensors: 138 (grouped: '*' is any number, 'layers.*.*' every block parameter of every layer, 'res[*].*' every residual; --json lists each)
  category     memory tensors                  count bytes/device  type/device        sharding
  params       device wte                          1        32768  f32[256,32]        whole
  params       device layers.*.*                  18        82432  (various)          whole
  params       device final_norm                   1          128  f32[32]            whole
  grads        device grad:final_norm              1          128  f32[32]            whole
  grads        device hgrad:wte                    1        32768  f32[256,32]        whole
  grads        device grad:layers.*.*             18        82432  (various)          whole
  grads        device grad:wte                     1        32768  f32[256,32]        whole
  grads        device gtmp:final_norm              1          128  f32[32]            whole
  grads        device gtmp:layers.*.*             18        82432  (various)          whole
  grads        device gtmp:wte                     1        32768  f32[256,32]        whole
  optimizer    device m:wte                        1        32768  f32[256,32]        whole
  optimizer    device v:wte                        1        32768  f32[256,32]        whole
  optimizer    device m:layers.*.*                18        82432  (various)          whole
  optimizer    device v:layers.*.*                18        82432  (various)          whole
  optimizer    device m:final_norm                 1          128  f32[32]            whole
  optimizer    device v:final_norm                 1          128  f32[32]            whole
  activations  device x[*]                         3        12288  f32[2,16,32]       whole
  activations  device dx                           1         4096  f32[2,16,32]       whole
  activations  device res[*].*                    16        74240  (various)          whole
  activations  device y_re                         1         4096  f32[2,16,32]       whole
  transfer     device tokens[*]                    2          256  s32[2,16]          whole
  transfer     device targets[*]                   2          256  s32[2,16]          whole
  transfer     device mask[*]                      2          256  f32[2,16]          whole
  transfer     device loss[*]                      2            8  f32[]              whole
  transfer     device sq[*]                        4           16  f32[]              whole
  transfer     device step                         1            4  f32[]              whole
  transfer     device lr                           1            4  f32[]              whole
  transfer     device gscale                       1            4  f32[]              whole
  transfer     device hyper                        1           16  f32[4]             whole
# collectives per layer, in plan order (bytes per device: the message, and what a ring sends)
  none: one device
# communication per step: 0 collectives, 0 B per device (message), 0 B sent per device, 0 B over all devices
# predicted memory per device, bytes
                                   params        grads    optimizer  activations     transfer        total
  persistent state                 115328            0       230656            0            0       345984
  training step peak               115328       189312       230656        49408          136       584840
  evaluation peak                  115328            0            0         8192          256       123776
  host memory (offloaded homes): 0
WANT
exact one configs/test.yml sched.remat=full

# fsdp=2: the state in fsdp blocks, gathered and unreduced tensors, all-gathers
# and reduce-scatters per layer and microbatch, the FSDP memory columns.
cat >"$TMP/fsdp2.want" <<'WANT'
# mesh: data=1 fsdp=2 tensor=1: 2 devices (runtime devices 0 1); fsdp groups [[0 1]]
# policy: remat=full offload=none prefetch_depth=1 wait=deferred optimizer=after_backward fsdp=2 gather_prefetch=1 reshard_after_forward=true
# tensors: 178 (grouped: '*' is any number, 'layers.*.*' every block parameter of every layer, 'res[*].*' every residual; --json lists each)
  category     memory tensors                  count bytes/device  type/device        sharding
  params       device wte                          1        16384  f32[128,32]        sharded over fsdp (dim 0, zero-padded)
  params       device layers.*.*                  18        41216  (various)          sharded over fsdp (dim 0, zero-padded)
  params       device final_norm                   1           64  f32[16]            sharded over fsdp (dim 0, zero-padded)
  grads        device grad:final_norm              1           64  f32[16]            sharded over fsdp (dim 0, zero-padded)
  grads        device grad:layers.*.*             18        41216  (various)          sharded over fsdp (dim 0, zero-padded)
  grads        device grad:wte                     1        16384  f32[128,32]        sharded over fsdp (dim 0, zero-padded)
  grads        device gtmp:final_norm              1           64  f32[16]            sharded over fsdp (dim 0, zero-padded)
  grads        device gtmp:layers.*.*             18        41216  (various)          sharded over fsdp (dim 0, zero-padded)
  grads        device gtmp:wte                     1        16384  f32[128,32]        sharded over fsdp (dim 0, zero-padded)
  optimizer    device m:wte                        1        16384  f32[128,32]        sharded over fsdp (dim 0, zero-padded)
  optimizer    device v:wte                        1        16384  f32[128,32]        sharded over fsdp (dim 0, zero-padded)
  optimizer    device m:layers.*.*                18        41216  (various)          sharded over fsdp (dim 0, zero-padded)
  optimizer    device v:layers.*.*                18        41216  (various)          sharded over fsdp (dim 0, zero-padded)
  optimizer    device m:final_norm                 1           64  f32[16]            sharded over fsdp (dim 0, zero-padded)
  optimizer    device v:final_norm                 1           64  f32[16]            sharded over fsdp (dim 0, zero-padded)
  activations  device x[*]                         3         6144  f32[1,16,32]       split over fsdp (dim 0)
  activations  device dx                           1         2048  f32[1,16,32]       split over fsdp (dim 0)
  activations  device res[*].*                    16        37120  (various)          split over fsdp (dim 0)
  activations  device y_re                         1         2048  f32[1,16,32]       split over fsdp (dim 0)
  transfer     device tokens[*]                    2          128  s32[1,16]          split over fsdp (dim 0)
  transfer     device targets[*]                   2          128  s32[1,16]          split over fsdp (dim 0)
  transfer     device mask[*]                      2          128  f32[1,16]          split over fsdp (dim 0)
  transfer     device loss[*]                      2            8  f32[]              one per device (fsdp)
  transfer     device sq[*]                        4           16  f32[]              partial over fsdp (the device's blocks; the host adds them)
  transfer     device step                         1            4  f32[]              replicated over fsdp
  transfer     device lr                           1            4  f32[]              replicated over fsdp
  transfer     device gscale                       1            4  f32[]              replicated over fsdp
  transfer     device hyper                        1           16  f32[4]             replicated over fsdp
  gathered     device full:wte                     1        32768  f32[256,32]        gathered: whole on every device (all-gathered over fsdp before its use, freed after)
  gathered     device full:layers.*.*             18        82432  (various)          gathered: whole on every device (all-gathered over fsdp before its use, freed after)
  gathered     device full:final_norm              1          128  f32[32]            gathered: whole on every device (all-gathered over fsdp before its use, freed after)
  unreduced    device ugrad:final_norm             1          128  f32[32]            unreduced: whole, partial over fsdp (sum over devices until reduce-scattered)
  unreduced    device hgrad:wte                    1        32768  f32[256,32]        unreduced: whole, partial over fsdp (sum over devices until reduce-scattered)
  unreduced    device ugrad:layers.*.*            18        82432  (various)          unreduced: whole, partial over fsdp (sum over devices until reduce-scattered)
  unreduced    device ugrad:wte                    1        32768  f32[256,32]        unreduced: whole, partial over fsdp (sum over devices until reduce-scattered)
# fsdp blocks: dim 0 cut in ceil(d0 / 2) rows per device; 0 of 100 sharded tensors padded, 0 B of zero rows over the fsdp group
# collectives per layer, in plan order (bytes per device: the message, and what a ring sends)
  op    3 embed     embed_fsdp_all_gather      all_gather     over fsdp     1 tensors      32768 B  wire      16384 B
  op    4 layer 0   block_fsdp_all_gather      all_gather     over fsdp     9 tensors      41216 B  wire      20608 B
  op    7 layer 1   block_fsdp_all_gather      all_gather     over fsdp     9 tensors      41216 B  wire      20608 B
  op   10 head      head_fsdp_all_gather       all_gather     over fsdp     1 tensors        128 B  wire         64 B
  op   11 embed     embed_fsdp_all_gather      all_gather     over fsdp     1 tensors      32768 B  wire      16384 B
  op   15 layer 1   block_fsdp_all_gather      all_gather     over fsdp     9 tensors      41216 B  wire      20608 B
  op   19 head      head_fsdp_reduce_scatter   reduce_scatter over fsdp     1 tensors        128 B  wire         64 B
  op   24 layer 0   block_fsdp_all_gather      all_gather     over fsdp     9 tensors      41216 B  wire      20608 B
  op   27 layer 1   block_fsdp_reduce_scatter  reduce_scatter over fsdp     9 tensors      41216 B  wire      20608 B
  op   32 embed     embed_fsdp_all_gather      all_gather     over fsdp     1 tensors      32768 B  wire      16384 B
  op   35 layer 0   block_fsdp_reduce_scatter  reduce_scatter over fsdp     9 tensors      41216 B  wire      20608 B
  op   41 embed     embed_fsdp_reduce_scatter  reduce_scatter over fsdp     1 tensors      32768 B  wire      16384 B
  op   46 layer 0   block_fsdp_all_gather      all_gather     over fsdp     9 tensors      41216 B  wire      20608 B
  op   49 layer 1   block_fsdp_all_gather      all_gather     over fsdp     9 tensors      41216 B  wire      20608 B
  op   52 head      head_fsdp_all_gather       all_gather     over fsdp     1 tensors        128 B  wire         64 B
  op   53 embed     embed_fsdp_all_gather      all_gather     over fsdp     1 tensors      32768 B  wire      16384 B
  op   57 layer 1   block_fsdp_all_gather      all_gather     over fsdp     9 tensors      41216 B  wire      20608 B
  op   61 head      head_fsdp_reduce_scatter   reduce_scatter over fsdp     1 tensors        128 B  wire         64 B
  op   66 layer 0   block_fsdp_all_gather      all_gather     over fsdp     9 tensors      41216 B  wire      20608 B
  op   71 layer 1   block_fsdp_reduce_scatter  reduce_scatter over fsdp     9 tensors      41216 B  wire      20608 B
  op   76 embed     embed_fsdp_all_gather      all_gather     over fsdp     1 tensors      32768 B  wire      16384 B
  op   81 layer 0   block_fsdp_reduce_scatter  reduce_scatter over fsdp     9 tensors      41216 B  wire      20608 B
  op   90 embed     embed_fsdp_reduce_scatter  reduce_scatter over fsdp     1 tensors      32768 B  wire      16384 B
# communication per step: 23 collectives, 724480 B per device (message), 362240 B sent per device, 724480 B over all devices
  all_gather        15 collectives     493824 B per device (message)     246912 B sent per device
  reduce_scatter     8 collectives     230656 B per device (message)     115328 B sent per device
# predicted memory per device, bytes
                                   params        grads    optimizer  activations     transfer     gathered    unreduced        total
  persistent state                  57664            0       115328            0            0            0            0       172992
  training step peak                57664        78272       115328        22656           72        73984        73984       421960
  evaluation peak                   57664            0            0         4096          128        82432            0       144320
  largest in the step               57664        78272       115328        26752          200        82432        73984
  host memory (offloaded homes): 0
WANT
exact fsdp2 configs/test.yml parallel.fsdp=2 sched.remat=full

# --- --json: everything, consistent with the plan and the bundle -------------------
for c in one data2 fsdp2 data2_fsdp2; do
  extra=()
  [ "$c" = data2 ] && extra=(parallel.data=2 runtime.cpu_devices=4)
  [ "$c" = fsdp2 ] && extra=(parallel.fsdp=2)
  [ "$c" = data2_fsdp2 ] && extra=(parallel.data=2 parallel.fsdp=2 runtime.cpu_devices=4 train.batch_size=8)
  "$STRATA" plan --explain --json configs/test.yml "${extra[@]}" >"$TMP/$c.json" 2>"$TMP/$c.jerr" || bad "plan --explain --json ($c) failed"
  "$STRATA" plan --json configs/test.yml "${extra[@]}" >"$TMP/$c.plan.json" 2>/dev/null || bad "plan --json ($c) failed"
  check "plan --explain --json ($c): every slot with its sharding, collectives as in the manifest, peaks as planned" "$PY - '$TMP/$c.json' '$TMP/$c.plan.json' $c <<'PYEOF'
import json, os, sys
doc = json.load(open(sys.argv[1]))
plan = json.load(open(sys.argv[2]))
case = sys.argv[3]
e, step = doc['explain'], plan['step']
D, F = {'one': (1, 1), 'data2': (2, 1), 'fsdp2': (1, 2), 'data2_fsdp2': (2, 2)}[case]
nd = D * F
groups = {'one': {}, 'data2': {'data': [[0, 1]]}, 'fsdp2': {'fsdp': [[0, 1]]},
          'data2_fsdp2': {'data': [[0, 2], [1, 3]], 'fsdp': [[0, 1], [2, 3]]}}[case]
assert e['mesh'] == {'data': D, 'fsdp': F, 'tensor': 1, 'devices': nd, 'runtime_devices': list(range(nd)),
                     'groups': groups}, e['mesh']
assert e['policy'] == step['policy']
if nd > 1:
    assert plan['step']['mesh'] == {'data': D, 'fsdp': F, 'tensor': 1}
lead = lambda ty: int(ty.split('[')[1].split(',')[0].rstrip(']'))
# every tensor of the step plan, in slot order, with its per-device type and layout
assert [t['name'] for t in e['tensors']] == [s['name'] for s in step['slots']]
for t, s in zip(e['tensors'], step['slots']):
    assert t['category'] == s['category'] and t['type_per_device'] == s['type'] and t['bytes_per_device'] == s['bytes'], (t, s)
    assert t['layout'] == s.get('layout', 'whole'), (t, s)
    if t['layout'] == 'split' and not t['type'].endswith('[]'):
        assert lead(t['type']) == nd * lead(t['type_per_device']), t
    elif t['layout'] == 'sharded':  # an fsdp block: ceil(d0 / F) rows, the rest zero padding
        assert t['type'] == s['logical_type'] and lead(t['type_per_device']) == -(-lead(t['type']) // F), t
        assert t['pad_rows'] == F * lead(t['type_per_device']) - lead(t['type']) == 0, t  # test.yml divides by 2
    else:
        assert t['type'] == t['type_per_device'], t
cats = {t['category'] for t in e['tensors']}
assert cats == {'params', 'grads', 'optimizer', 'activations', 'transfer'} | ({'gathered', 'unreduced'} if F > 1 else set()), cats
if nd > 1:
    lay = {t['category']: set() for t in e['tensors']}
    for t in e['tensors']:
        lay[t['category']].add(t['layout'])
    if F == 1:
        assert lay['params'] == lay['optimizer'] == {'replicated'} and lay['grads'] == {'partial'} and lay['activations'] == {'split'}, lay
    else:
        assert lay['params'] == lay['optimizer'] == lay['grads'] == {'sharded'} and lay['activations'] == {'split'}, lay
        assert lay['gathered'] == {'replicated'} and lay['unreduced'] == {'partial'}, lay
# the collectives: the plan's COLLECTIVE ops, bytes from the bundle manifest
colls = [o for o in step['ops'] if o['kind'] == 'COLLECTIVE']
assert [c['op'] for c in e['collectives']] == [o['index'] for o in colls]
man = json.load(open(os.path.join(doc['bundle'], 'manifest.json')))
by_name = {c['name']: c for c in man.get('collectives', [])}
for c, o in zip(e['collectives'], colls):
    m = by_name[c['program']]
    assert c['program'] == o['program'] and c['layer'] == o['layer'] and c['devices'] == nd
    assert (c['kind'], c['axis']) == (m['kind'], m['axis']) and c['group_size'] == m['axis_size'], (c, m)
    assert c['bytes_per_device'] == m['bytes_per_device'] and c['wire_bytes_per_device'] == m['wire_bytes_per_device'], (c, m)
    assert c['tensors'] == [step['slots'][i]['name'] for i in o['inputs']]
    blocks = o['outputs'] if c['kind'] == 'reduce_scatter' else o['inputs']
    per = sum(step['slots'][i]['bytes'] for i in blocks)
    assert c['bytes_per_device'] == (per if c['kind'] == 'all_reduce' else c['group_size'] * per), c
comm = e['communication_per_step']
n_inst, micro = 4, 2
assert comm['collectives'] == len(colls) == {'one': 0, 'data2': n_inst}.get(case, len(colls))
assert comm['bytes_per_device'] == sum(c['bytes_per_device'] for c in e['collectives'])
assert comm['wire_bytes_per_device'] == sum(c['wire_bytes_per_device'] for c in e['collectives'])
assert comm['wire_bytes_all_devices'] == nd * comm['wire_bytes_per_device']
for k, v in comm['by_kind'].items():
    mine = [c for c in e['collectives'] if c['kind'] == k]
    assert v == {'collectives': len(mine), 'bytes_per_device': sum(c['bytes_per_device'] for c in mine),
                 'wire_bytes_per_device': sum(c['wire_bytes_per_device'] for c in mine)}, (k, v)
params = sum(s['bytes'] for s in step['slots'] if s['category'] == 'params' and s['persistent'])
whole = F * params  # test.yml's dims divide by fsdp: no padding
if F == 1:
    assert comm['bytes_per_device'] == (params if nd > 1 else 0)  # data parallelism reduces every gradient once
else:
    # every microbatch reduce-scatters every whole gradient; HSDP all-reduces the blocks once over data
    assert comm['by_kind']['reduce_scatter']['bytes_per_device'] == micro * whole, comm
    assert comm['by_kind'].get('all_reduce', {'bytes_per_device': 0})['bytes_per_device'] == (params if D > 1 else 0), comm
mem = e['memory_per_device']
assert mem['peak_bytes'] == step['predicted_peak_bytes'] == sum(mem['peak_by_category'].values())
assert mem['peak_by_category'] == step['predicted_peak_by_category']
assert mem['eval_peak_bytes'] == plan['eval']['predicted_peak_bytes'] == sum(mem['eval_peak_by_category'].values())
assert mem['host_bytes'] == step['host_bytes']
assert mem['persistent_by_category']['optimizer'] == 2 * mem['persistent_by_category']['params'] == 2 * params
for k, v in mem['max_by_category'].items():
    assert v == max([mem['persistent_by_category'][k]] + [o['live_bytes'][k] for o in step['ops']]), (k, v)
print(f'# explain {case}: {len(e[\"tensors\"])} tensors, {comm[\"collectives\"]} collectives, peak {mem[\"peak_bytes\"]} B per device')
PYEOF"
done

# --- the plain plan text does not change --------------------------------------------
out=$("$STRATA" plan configs/test.yml 2>/dev/null)
check "plain strata plan has no explanation in it" "! grep -q '^# mesh:' <<<\"\$out\" && grep -q '^# live bytes after each op' <<<\"\$out\""

# --- tensor meshes: how each kind of tensor lies -------------------------------------
tp=$("$STRATA" plan --explain configs/test.yml parallel.data=2 parallel.tensor=2 sched.remat=full runtime.cpu_devices=4 2>/dev/null)
check "explain data=2 x tensor=2: the mesh's groups" "grep -qF '# mesh: data=2 fsdp=1 tensor=2: 4 devices (runtime devices 0 1 2 3); data groups [[0 2] [1 3]]; tensor groups [[0 1] [2 3]]' <<<\"\$tp\""
check "explain data=2 x tensor=2: row-parallel weights cut along dim 0, replicated over data" "grep -qE '^  params +device layers\\.\\*\\.\\* +4 +12288 +\\(various\\) +sharded: dim 0 over tensor, replicated over data$' <<<\"\$tp\""
check "explain data=2 x tensor=2: column-parallel weights cut along dim 1" "grep -qE '^  params +device layers\\.\\*\\.\\* +10 +28672 +\\(various\\) +sharded: dim 1 over tensor, replicated over data$' <<<\"\$tp\""
check "explain data=2 x tensor=2: whole gradients partial over data, equal in a tensor group" "grep -qE '^  grads +device grad:wte +1 +32768 +f32\\[256,32\\] +partial over data \\(sum over devices until all-reduced\\), the same on every device of a tensor group$' <<<\"\$tp\""
check "explain data=2 x tensor=2: residuals hold the device's heads, activations the device's rows, the same over tensor" "grep -qE '^  activations +device res\\[\\*\\]\\.\\* .*split over data \\(dim 0\\), the device.s heads or MLP units over tensor$' <<<\"\$tp\" && grep -qE '^  activations +device x\\[\\*\\] +3 +6144 +f32\\[1,16,32\\] +split over data \\(dim 0\\), the same over tensor$' <<<\"\$tp\""
tpj=$("$STRATA" plan --explain --json configs/test.yml parallel.data=2 parallel.tensor=2 sched.remat=full runtime.cpu_devices=4 2>/dev/null)
check "explain --json data=2 x tensor=2: the logical batch is the data shares' rows (not x tensor)" "$PY -c 'import json,sys; e=json.loads(sys.argv[1])[\"explain\"]; t={x[\"name\"]:x for x in e[\"tensors\"]}; assert t[\"x[0]\"][\"type\"]==\"f32[2,16,32]\", t[\"x[0]\"]' \"\$tpj\""
check "explain data=2 x tensor=2: the block's all-reduce moves its tensor blocks (20736 B, not 41216)" "grep -qE '^  op +[0-9]+ layer 1 +block_data_all_reduce +all_reduce over data +9 tensors +20736 B' <<<\"\$tp\""

# --- a job of several processes: the axis that spans them, what crosses them -------
# (docs/multiprocess.md, "What crosses the network"). `strata plan` needs no
# launcher: parallel.processes alone gives the job's plan (rank 0's; every
# rank's is the same).
jp=$("$STRATA" plan --explain configs/test.yml parallel.processes=2 parallel.data=2 runtime.cpu_devices=1 2>/dev/null)
check "explain 2 processes x data=2: data spans the processes, one device each" "grep -qF \"# processes: 2; the job's mesh data=2 fsdp=1 tensor=1 is 2 processes x 1 device; data spans the processes (the outermost mesh axis above 1), so the mesh above is one process's part of it\" <<<\"\$jp\" && grep -qF '# mesh: data=1 fsdp=1 tensor=1: 1 device (runtime device 0)' <<<\"\$jp\""
check "explain 2 processes x data=2: every gradient all-reduced across processes once, 2(P-1)/P of it sent" "grep -qF '# across processes per step: 4 ops, 115328 B per process (message), 115328 B sent per process, 230656 B over all processes' <<<\"\$jp\" && grep -qE '^  op +[0-9]+ layer 1 +all_reduce +over data +across 2 processes +9 tensors +41216 B  sent +41216 B$' <<<\"\$jp\""
check "explain of one process says nothing about processes" "! grep -q '^# processes\\|^# cross-process\\|^# across processes' \"\$TMP/data2.out\" \"\$TMP/one.out\""
for c in "2 2 1" "2 4 2" "4 4 1"; do
  read -r P D N <<<"$c"
  args=(configs/test.yml parallel.processes=$P parallel.data=$D runtime.cpu_devices=$N train.batch_size=$((2 * D)))
  "$STRATA" plan --explain --json "${args[@]}" >"$TMP/job$P$D.json" 2>/dev/null || bad "plan --explain --json processes=$P data=$D failed"
  "$STRATA" plan --json "${args[@]}" >"$TMP/job$P$D.plan.json" 2>/dev/null || bad "plan --json processes=$P data=$D failed"
  check "explain --json $P processes x data=$D: XPROC ops with the engine's bytes (alltoall + all-gather of ceil(n/P) blocks)" "$PY - '$TMP/job$P$D.json' '$TMP/job$P$D.plan.json' $P $D <<'PYEOF'
import json, sys
e = json.load(open(sys.argv[1]))['explain']
step = json.load(open(sys.argv[2]))['step']
P, D = int(sys.argv[3]), int(sys.argv[4])
nd = D // P  # this process's devices: data spans the processes
assert e['processes'] == {'count': P, 'span_axis': 'data', 'job_mesh': {'data': D, 'fsdp': 1, 'tensor': 1},
                          'devices_per_process': nd, 'devices_in_job': D}, e['processes']
assert e['mesh']['data'] == nd and e['mesh']['devices'] == nd
xs = [o for o in step['ops'] if o['kind'] == 'XPROC']
assert [c['op'] for c in e['cross_process']] == [o['index'] for o in xs] and len(xs) == 4
slots = step['slots']
for c, o in zip(e['cross_process'], xs):
    assert (c['kind'], c['axis'], c['processes']) == ('all_reduce', 'data', P), c
    assert c['tensors'] == [slots[i]['name'] for i in o['inputs']] and c['collectives_per_process'] == nd * len(o['inputs'])
    assert c['bytes_per_process'] == nd * sum(slots[i]['bytes'] for i in o['inputs']), c
    # src/dist/coll.c: an alltoall of P blocks of ceil(n/P) floats, then an all-gather of them: (P-1) blocks sent per phase
    assert c['wire_bytes_per_process'] == nd * sum(2 * (P - 1) * -(-(slots[i]['bytes'] // 4) // P) * 4 for i in o['inputs']), c
x = e['cross_process_per_step']
params = sum(s['bytes'] for s in slots if s['category'] == 'params' and s['persistent'])
assert x['ops'] == 4 and x['bytes_per_process'] == nd * params, x
assert x['wire_bytes_per_process'] == sum(c['wire_bytes_per_process'] for c in e['cross_process'])
assert x['wire_bytes_all_processes'] == P * x['wire_bytes_per_process']
assert x['by_kind'] == {'all_reduce': {'ops': 4, 'bytes_per_process': x['bytes_per_process'],
                                       'wire_bytes_per_process': x['wire_bytes_per_process']}}, x
PYEOF"
done
check "explain --json of one process has no processes key" "$PY -c 'import json,sys; e=json.load(open(sys.argv[1]))[\"explain\"]; assert \"processes\" not in e and \"cross_process\" not in e' '$TMP/data2.json'"

finish test_explain.sh
