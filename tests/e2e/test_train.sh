#!/usr/bin/env bash
# test_train.sh — `strata train`, `plan`, `data` end to end on the real
# exporter and CPU plugin: the run directory contract (docs/design.md §4), the
# snapshot round trip (issue 4), and every bad-input class of issue 3 with
# its exit code and the file it names. Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d /tmp/strata-e2e-train-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# A private cache so bundle tampering below cannot disturb other tests.
export STRATA_CACHE_DIR="$TMP/cache"

source "$(dirname "$0")/lib.sh"

BASE=(configs/test.yml runtime.deterministic=true run.progress=off)

# --- doctor -----------------------------------------------------------------------
expect_exit 0 "status: +ok" doctor
check "doctor: plugin, API version, compile threads, devices, a matmul figure, a bandwidth figure" \
  "grep -Eq '^PJRT C API: +0\.[0-9]+' '$TMP/out' && grep -Eq '^compile: +[0-9]+ programs? at once' '$TMP/out' && grep -Eq '^devices: +2' '$TMP/out' && grep -Eq '^matmul: .*GFLOP/s' '$TMP/out' && grep -Eq '^bandwidth: +32 MiB f32 add on device 0: [0-9.]+ GB/s' '$TMP/out'"
cp "$TMP/out" "$TMP/doctor.out"
check "doctor stores its matmul and bandwidth measurements in the cache, keyed by plugin and device kind" \
  "grep -q '\"by\": \"doctor\"' \"\$STRATA_CACHE_DIR\"/matmul_peak/*.json && grep -q '\"device_kind\": \"cpu\"' \"\$STRATA_CACHE_DIR\"/matmul_peak/*.json && grep -q '\"best_gbps\": [0-9]' \"\$STRATA_CACHE_DIR\"/matmul_peak/*.json"

# --- a good run and its directory -------------------------------------------
if "$STRATA" train "${BASE[@]}" run.dir="$TMP/r1" >"$TMP/out1" 2>"$TMP/err1"; then ok; else bad "train exited $?: $(tail -5 "$TMP/err1")"; fi
check "prints the run directory" "grep -q 'run directory: $TMP/r1' '$TMP/out1'"
for f in config.yaml context.json events.jsonl metrics.jsonl params.safetensors; do
  check "run dir has $f" "[ -s '$TMP/r1/$f' ]"
done
check "metrics lines carry the contract fields" "$PY - '$TMP/r1/metrics.jsonl' <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [l for l in lines if 'loss' in l]
evals = [l for l in lines if 'eval_loss' in l]
need = {'step', 'loss', 'lr', 'grad_norm', 'tokens', 'step_time_s', 'tokens_per_s'}
assert len(steps) == 10 and all(need <= set(l) for l in steps), steps[:1]
assert [l['step'] for l in steps] == list(range(1, 11))
assert evals and evals[-1]['step'] == 10
PYEOF"
check "context.json holds versions, plugin, devices, hashes" "$PY - '$TMP/r1/context.json' <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
for k in ('run_id', 'strata_version', 'git_commit', 'jax_version', 'platform_name', 'pjrt_api_version',
          'devices', 'host', 'cpu_model', 'cpu_cores', 'memory', 'environment', 'config_hash', 'bundle_key'):
    assert k in c, k
assert c['platform_name'] == 'cpu' and len(c['devices']) >= 1
PYEOF"
check "first event carries the context" "head -1 '$TMP/r1/events.jsonl' | grep -q '\"context\"'"
check "events record the lifecycle" "grep -q '\"run_done\"' '$TMP/r1/events.jsonl' && tail -1 '$TMP/r1/events.jsonl' | grep -q '\"done\"'"

# --- the snapshot reproduces the run -----------------------------------------
if "$STRATA" train "$TMP/r1/config.yaml" run.dir="$TMP/r2" >/dev/null 2>"$TMP/err2"; then ok; else bad "replay exited $?: $(tail -3 "$TMP/err2")"; fi
check "replayed config has the same config hash and bundle key" "$PY - '$TMP/r1' '$TMP/r2' <<'PYEOF'
import json, sys
a, b = (json.load(open(d + '/context.json')) for d in sys.argv[1:])
assert a['config_hash'] == b['config_hash'], (a['config_hash'], b['config_hash'])
assert a['bundle_key'] == b['bundle_key']
PYEOF"
check "replayed run has the same first 10 losses" "diff <(grep '\"loss\"' '$TMP/r1/metrics.jsonl' | head -10 | sed 's/.*\"loss\": \([^,]*\),.*/\1/') <(grep '\"loss\"' '$TMP/r2/metrics.jsonl' | head -10 | sed 's/.*\"loss\": \([^,]*\),.*/\1/')"

# --- an existing run directory is refused ------------------------------------
expect_exit 2 "run directory '$TMP/r1' already holds a run" train "${BASE[@]}" run.dir="$TMP/r1"

# --- strata plan ---------------------------------------------------------------
if "$STRATA" plan "${BASE[@]}" >"$TMP/plan" 2>"$TMP/err"; then ok; else bad "plan exited $?"; fi
check "plan lists per-layer launches" "grep -Eq 'LAUNCH +block_fwd layer=1' '$TMP/plan' && grep -Eq 'LAUNCH +block_bwd_res layer=0' '$TMP/plan' && grep -Eq 'LAUNCH +adamw_block layer=1' '$TMP/plan'"
check "plan --json parses" "'$STRATA' plan --json ${BASE[*]} 2>/dev/null | $PY -c 'import json,sys; d=json.load(sys.stdin); assert d[\"step\"][\"ops\"]'"

# --- bad data: exit 3 naming the file ------------------------------------------
expect_exit 3 "data.path '/nonexistent/corpus' does not exist" train "${BASE[@]}" data.synthetic=false data.path=/nonexistent/corpus run.dir="$TMP/d1"
: >"$TMP/empty.txt"
expect_exit 3 "corpus '$TMP/empty.txt' is empty" train "${BASE[@]}" data.synthetic=false data.path="$TMP/empty.txt" run.dir="$TMP/d2"
mkdir -p "$TMP/emptydir"
expect_exit 3 "corpus '$TMP/emptydir' is empty" train "${BASE[@]}" data.synthetic=false data.path="$TMP/emptydir" run.dir="$TMP/d3"
# token files: header fields per docs/data.md
mktok() { # PATH VERSION VOCAB TOKEN_BYTES COUNT_IN_HEADER TOKENS...
  $PY - "$@" <<'PYEOF'
import struct, sys
path, ver, vocab, tb, count, *toks = sys.argv[1:]
with open(path, 'wb') as f:
    f.write(b'STRATOK1' + struct.pack('<IIII', int(ver), int(vocab), int(tb), 0) + struct.pack('<Q', int(count)))
    f.write(b''.join(struct.pack('<H' if tb == '2' else '<I', int(t)) for t in toks))
PYEOF
}
toks=$(seq 0 199 | tr '\n' ' ')
mktok "$TMP/big.tok" 1 256 4 201 $toks 300
expect_exit 3 "token file '$TMP/big.tok': token 200 is 300, not below model.vocab_size 256" train "${BASE[@]}" data.synthetic=false data.path="$TMP/big.tok" run.dir="$TMP/d4"
mktok "$TMP/ver.tok" 7 256 2 200 $toks
expect_exit 3 "token file '$TMP/ver.tok': version 7" train "${BASE[@]}" data.synthetic=false data.path="$TMP/ver.tok" run.dir="$TMP/d5"
mktok "$TMP/short.tok" 1 256 2 500 $toks
expect_exit 3 "token file '$TMP/short.tok': header says 500 tokens .*truncated" train "${BASE[@]}" data.synthetic=false data.path="$TMP/short.tok" run.dir="$TMP/d6"
mktok "$TMP/tb.tok" 1 256 3 200 $toks
expect_exit 3 "token file '$TMP/tb.tok': token_bytes is 3" train "${BASE[@]}" data.synthetic=false data.path="$TMP/tb.tok" run.dir="$TMP/d7"
# A data error stops the run before its first step: its directory may hold
# config.yaml and the "failed" event, but no parameters, no checkpoint and
# no metrics line, in any of the seven runs above.
for d in d1 d2 d3 d4 d5 d6 d7; do
  check "data error run $d left no training output" \
    "[ ! -e '$TMP/$d/params.safetensors' ] && [ ! -e '$TMP/$d/checkpoints' ] && [ ! -s '$TMP/$d/metrics.jsonl' ]"
done
# A run that failed before its first step is an empty run: the same run.dir may be used again.
if "$STRATA" train "${BASE[@]}" train.steps=2 run.dir="$TMP/d1" >/dev/null 2>"$TMP/err"; then ok; else bad "reusing the run.dir of a data error exited $?: $(tail -2 "$TMP/err")"; fi
check "the reused run directory says so in events.jsonl and holds the new run" "grep -q '\"run_dir_reused\"' '$TMP/d1/events.jsonl' && [ -s '$TMP/d1/params.safetensors' ] && tail -1 '$TMP/d1/events.jsonl' | grep -q '\"done\"'"
expect_exit 2 "run directory '$TMP/d1' already holds a run" train "${BASE[@]}" train.steps=2 run.dir="$TMP/d1"
# A FIFO (or socket, device) as data.path is refused at once instead of blocking in open().
mkfifo "$TMP/corpus.fifo"
timeout 20 "$STRATA" train "${BASE[@]}" data.synthetic=false data.path="$TMP/corpus.fifo" run.dir="$TMP/d8" >"$TMP/out" 2>"$TMP/err"
rc=$?
check "a FIFO as data.path: exit 3 at once (rc $rc), naming it" "[ $rc = 3 ] && grep -q \"data.path '$TMP/corpus.fifo' is a FIFO, not a regular file or a folder\" '$TMP/err'"
# Too short a corpus: the message names the user's corpus and the token file made from it.
printf 'tiny corpus\n' >"$TMP/short.txt"
expect_exit 3 "corpus '$TMP/short.txt' \\(data.path; tokenized into '.*/tokens/[0-9a-f]+\\.tok'\\) has 12 tokens: too few" \
  train "${BASE[@]}" data.synthetic=false data.path="$TMP/short.txt" run.dir="$TMP/d9"
# u32 tokens are kept as u16: an id above 65535 is refused, not narrowed (found reading the token parser for the fuzz target)
mktok "$TMP/wide.tok" 1 70000 4 201 $toks 65536
expect_exit 3 "token file '$TMP/wide.tok': token 200 is 65536; strata keeps tokens as u16" train "${BASE[@]}" model.vocab_size=70000 data.synthetic=false data.path="$TMP/wide.tok" run.dir="$TMP/d10"

# --- bundles: a named stale bundle is an error, a cached one is re-exported ---
"$STRATA" export "${BASE[@]}" bundle.dir="$TMP/bundle" >/dev/null 2>&1 && ok || bad "export into bundle.dir failed"
# context.json reports the bundle's jaxlib version (manifest versions.jaxlib), not jax's.
cp -a "$TMP/bundle" "$TMP/bundle-v"
$PY - "$TMP/bundle-v/manifest.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
m['versions']['jaxlib'] = '0.0.1-jaxlib-test'
json.dump(m, open(sys.argv[1], 'w'), indent=1)
PYEOF
if "$STRATA" train "${BASE[@]}" train.steps=1 bundle.dir="$TMP/bundle-v" run.dir="$TMP/v1" >/dev/null 2>"$TMP/err"; then ok; else bad "train with bundle-v exited $?: $(tail -2 "$TMP/err")"; fi
check "context.json: jaxlib_version from the manifest's versions.jaxlib" "$PY - '$TMP/v1/context.json' '$TMP/bundle-v/manifest.json' <<'PYEOF'
import json, sys
c, m = (json.load(open(p)) for p in sys.argv[1:])
assert c['jaxlib_version'] == '0.0.1-jaxlib-test', c['jaxlib_version']
assert c['jax_version'] == m['versions']['jax'], (c['jax_version'], m['versions'])
PYEOF"
echo "// tampered" >>"$TMP/bundle/programs/block_fwd.mlir"
expect_exit 4 "bundle program file '$TMP/bundle/programs/block_fwd.mlir' was altered" train "${BASE[@]}" bundle.dir="$TMP/bundle" run.dir="$TMP/b1"
"$STRATA" export "${BASE[@]}" bundle.dir="$TMP/bundle2" >/dev/null 2>&1 && ok || bad "export into bundle.dir failed"
rm "$TMP/bundle2/programs/head_loss.mlir"
expect_exit 4 "bundle program 'head_loss' is missing: cannot open '$TMP/bundle2/programs/head_loss.mlir'" train "${BASE[@]}" bundle.dir="$TMP/bundle2" run.dir="$TMP/b0"
"$STRATA" export "${BASE[@]}" >"$TMP/out" 2>/dev/null
cached=$(sed 's/ (.*//' "$TMP/out")
echo "// tampered" >>"$cached/programs/block_bwd.mlir"
if "$STRATA" train "${BASE[@]}" run.dir="$TMP/b2" >/dev/null 2>"$TMP/err"; then ok; else bad "train over a tampered cached bundle exited $?"; fi
check "a tampered cached bundle is re-exported, not used" "grep -q 'stale bundle, re-exporting: bundle program file .*block_bwd.mlir. was altered' '$TMP/err'"
check "a re-exported bundle trains to the same losses" "diff <(grep -o '\"loss\": [^,]*' '$TMP/r1/metrics.jsonl') <(grep -o '\"loss\": [^,]*' '$TMP/b2/metrics.jsonl')"

# --- bundles: every count in a manifest is bounded (docs/bundle.md "Limits") ---
# A crafted block_fwd_res with 300 residual outputs used to overflow the
# plan builder's fixed arrays; now the manifest is refused as a bundle error.
cp -r "$cached" "$TMP/bundle3"
$PY - "$TMP/bundle3/manifest.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
p = {q['name']: q for q in m['programs']}
more = [dict(p['block_fwd_res']['outputs'][1], name=f'crafted{i}') for i in range(300)]
p['block_fwd_res']['outputs'] += more
p['block_bwd_res']['inputs'] = p['block_bwd_res']['inputs'][:-1] + more + p['block_bwd_res']['inputs'][-1:]
json.dump(m, open(sys.argv[1], 'w'))
PYEOF
expect_exit 4 "program 'block_fwd_res': 309 outputs exceeds the limit of 256 \\(ST_BUNDLE_MAX_PROGRAM_TENSORS" train "${BASE[@]}" bundle.dir="$TMP/bundle3" run.dir="$TMP/b3"

# --- the end-of-run summary (run.progress=on, as on a terminal) ----------------
SUM=(configs/test.yml runtime.deterministic=true data.synthetic=false data.path=/usr/share/games/fortunes train.steps=4 train.eval_every=2)
if "$STRATA" train "${SUM[@]}" run.progress=on run.dir="$TMP/sum" >"$TMP/sum.out" 2>"$TMP/sum.err"; then ok; else bad "train exited $?: $(tail -5 "$TMP/sum.err")"; fi
check "summary: the figures are the run's own (losses as in metrics.jsonl, bits per byte = eval loss / ln 2, tokens/s from the step times, the share of doctor's matmul peak, the checkpoint that exists)" "$PY - '$TMP/sum' '$TMP/sum.err' '$TMP/doctor.out' <<'PYEOF'
import json, math, re, sys, os
d, err = sys.argv[1], open(sys.argv[2]).read()
lines = [json.loads(x) for x in open(os.path.join(d, 'metrics.jsonl'))]
steps = [m for m in lines if 'loss' in m]
evals = [m for m in lines if 'eval_loss' in m]
head = re.search(r'^strata: trained 4 steps in ([0-9.]+) s of steps \\(4 this run, 28832 parameters\\)$', err, re.M)
assert head, err
assert abs(float(head.group(1)) - sum(m['step_time_s'] for m in steps)) < 0.06, (head.group(1), err)
m = re.search(r'^  final train loss ([0-9.]+), eval loss ([0-9.]+) \\(([0-9.]+) bits per byte\\)$', err, re.M)
assert m, err
assert m.group(1) == f\"{steps[-1]['loss']:.4f}\" and m.group(2) == f\"{evals[-1]['eval_loss']:.4f}\", (m.groups(), steps[-1], evals[-1])
assert m.group(3) == f\"{evals[-1]['eval_loss'] / math.log(2):.3f}\", m.groups()
t = re.search(r'^  ([0-9]+) tokens/s \\(([0-9.e+]+) model FLOP per token\\)$', err, re.M)
tps = 4 * 4 * 16 / sum(m['step_time_s'] for m in steps)
assert t and abs(int(t.group(1)) - tps) <= max(1, 0.03 * tps), (t and t.groups(), tps)
# The share of the matmul peak: consistent with the rate and the peak printed.
f = re.search(r'^  ([0-9.e+-]+) GFLOP/s of model FLOPs = ([0-9.e+-]+)% of the measured matmul peak \\(([0-9.e+-]+) GFLOP/s, strata (doctor|train)\\)$', err, re.M)
assert f, err
x, y, z = (float(f.group(i)) for i in (1, 2, 3))
assert abs(x - tps * float(t.group(2)) / 1e9) <= 0.03 * x, (x, tps, t.groups())
assert z > 0 and abs(y - 100 * x / z) <= 0.01 * y, (x, y, z)
# The peak is the one strata doctor measured and stored at the top of this script.
best = re.search(r'^matmul: .*; best ([0-9.]+)\\)$', open(sys.argv[3]).read(), re.M)
assert f.group(4) == 'doctor' and best and abs(z - float(best.group(1))) <= 0.001 * z + 0.05, (f.groups(), best)
pk = re.search(r'^  peak device memory ([0-9.]+) MiB', err, re.M)
assert pk and pk.group(1) == f\"{max(m['peak_live_bytes'] for m in steps) / 1048576:.1f}\", err
c = re.search(r'^  checkpoint (\\S+)$', err, re.M)
assert c and os.path.isdir(c.group(1)) and c.group(1).endswith('/checkpoints/step_4'), err
PYEOF"
check "no summary without progress (run.progress=off)" "! grep -q '^strata: trained' '$TMP/err1'"
# The sample after the summary (issue 16 item 2): on stderr, kept in
# sample.txt as UTF-8, and exactly what `strata sample RUN --tokens 128
# --seed <seed>` prints (bytes that are not UTF-8 as U+FFFD, one per byte).
"$STRATA" sample "$TMP/sum" --tokens 128 --seed 0 >"$TMP/sum.sample" 2>/dev/null
check "end of run: a sample after the summary on stderr, sample.txt = strata sample RUN --tokens 128 --seed 0" "$PY - '$TMP/sum' '$TMP/sum.err' '$TMP/sum.sample' <<'PYEOF'
import os, sys
d, err, cli = sys.argv[1], open(sys.argv[2], encoding='utf-8', errors='replace').read(), open(sys.argv[3], 'rb').read()
assert err.index('strata: trained') < err.index('  sample (temperature 0.8, seed 0; ') < err.index('(sample.txt in the run directory'), err
def clean(b):
    out, i = [], 0
    while i < len(b):
        for n in (1, 2, 3, 4):
            try:
                out.append(b[i:i + n].decode('utf-8')); i += n; break
            except UnicodeDecodeError:
                pass
        else:
            out.append('\ufffd'); i += 1
    return ''.join(out)
text = open(os.path.join(d, 'sample.txt'), 'rb').read().decode('utf-8')  # strict: UTF-8
assert len(cli) == 129 and cli[:1] == b'\n', cli
assert text == clean(cli), (text, cli)
PYEOF"
check "no sample.txt without progress (run.progress=off)" "[ ! -e '$TMP/r1/sample.txt' ] && ! grep -q 'sample (temperature' '$TMP/err1'"

# Three exports of one new bundle at once into one cache (two runs started
# together share it): the cache entry's lock lets one export and the others
# find its bundle; every one succeeds.
for i in 1 2 3; do STRATA_CACHE_DIR="$TMP/cache-race" "$STRATA" export configs/test.yml >"$TMP/race$i" 2>&1 & done
rcs=""
for j in $(jobs -p); do wait "$j"; rcs="$rcs$?"; done
check "three concurrent exports of one bundle: all exit 0 ($rcs), one exports, two find it up to date" \
  "[ '$rcs' = 000 ] && [ \$(cat '$TMP'/race[123] | grep -c '(exported,') = 1 ] && [ \$(cat '$TMP'/race[123] | grep -c '(up to date,') = 2 ]"

# Two ranks of mpirun on a mesh with no axis to span (docs/multiprocess.md):
# each rank would train alone, so every rank refuses before it creates
# anything (exit 2). Running as root (CI) needs Open MPI's consent, given
# here only. (tests/py/test_multiprocess.py trains across processes.)
if command -v mpirun >/dev/null 2>&1; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$STRATA" train configs/test.yml run.dir="$TMP/mpi-run" run.progress=off >"$TMP/mpi.out" 2>&1
  rc=$?
  # (mpirun ends the other rank once one exits non-zero: at least one says why.)
  check "mpirun -np 2 strata train on one device's mesh: refused (exit $rc), naming parallel.processes, no run dir" \
    "[ $rc = 2 ] && grep -q 'parallel.processes=2 (command line) but every mesh axis is 1: each process would train alone' '$TMP/mpi.out' && [ ! -e '$TMP/mpi-run' ]"
  # Ranks started with different configs (rank 1 another train.lr): the
  # start-up agreement stops every rank with exit 2 naming the key and
  # both values, before anything is created.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 bash -c \
    '"$0" train configs/test.yml parallel.data=2 runtime.cpu_devices=1 run.dir="$1" run.progress=off train.lr=0.00$((OMPI_COMM_WORLD_RANK + 1))' \
    "$STRATA" "$TMP/mpi-mismatch" >"$TMP/mpi-mm.out" 2>&1
  rc=$?
  # Every rank refuses after the agreement, but mpirun ends the job as soon
  # as the first one exits, so the other may be killed before it prints
  # (seen in CI): one message at least, from either rank.
  check "mpirun -np 2 with train.lr differing on rank 1: exit $rc (2), naming train.lr and both values, no run dir" \
    "[ $rc = 2 ] && [ \$(grep -c 'ranks resolved different runs: train.lr: rank 0 has 0.001, rank 1 has 0.002' '$TMP/mpi-mm.out') -ge 1 ] && [ ! -e '$TMP/mpi-mismatch' ]"
  # fsdp across processes (docs/multiprocess.md, "fsdp across processes"):
  # periodic checkpoints with tensor parallelism inside (per-rank shards are
  # built for one device per process) and more than one block per process
  # are refused on every rank before anything is created.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$STRATA" train configs/test.yml parallel.fsdp=2 parallel.tensor=2 runtime.cpu_devices=2 ckpt.every=5 run.dir="$TMP/mpi-fsdp-ckpt" \
    run.progress=off >"$TMP/mpi-fc.out" 2>&1
  rc=$?
  check "mpirun -np 2 with fsdp across processes x tensor=2 inside and ckpt.every=5 < train.steps: refused (exit $rc), naming ckpt.every, no run dir" \
    "[ $rc = 2 ] && grep -q 'ckpt.every=5 (command line) with parallel.fsdp=2 across 2 processes and parallel.tensor=2 inside: per-rank checkpoints are built for one device per process' '$TMP/mpi-fc.out' && [ ! -e '$TMP/mpi-fsdp-ckpt' ]"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$STRATA" train configs/test.yml parallel.fsdp=4 train.batch_size=8 runtime.cpu_devices=2 run.dir="$TMP/mpi-fsdp4" \
    run.progress=off >"$TMP/mpi-f4.out" 2>&1
  rc=$?
  check "mpirun -np 2 with parallel.fsdp=4: refused (exit $rc), one fsdp block per process" \
    "[ $rc = 2 ] && grep -q 'parallel.fsdp=4 (command line) spans the 2 processes, leaving fsdp=2 inside each' '$TMP/mpi-f4.out' && [ ! -e '$TMP/mpi-fsdp4' ]"
  # One PJRT client across the ranks forced on the CPU plugin, which
  # refuses node_id/num_nodes: every rank reaches the client's creation
  # (rank 0 lets the others go after the bundle, not after compiling) and
  # stops with exit 4 quoting the plugin, none waiting forever.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun --oversubscribe -np 2 \
    "$STRATA" train configs/test.yml parallel.data=2 runtime.cpu_devices=1 runtime.shared_client=on \
    run.dir="$TMP/mpi-shared" run.progress=off >"$TMP/mpi-shared.out" 2>&1
  rc=$?
  check "mpirun -np 2 with runtime.shared_client=on on the CPU plugin: exit $rc (4), both ranks at the client's creation" \
    "[ $rc = 4 ] && grep -q 'runtime.shared_client=on: one PJRT client across the job.s 2 processes' '$TMP/mpi-shared.out' && grep -q 'creating one client across 2 processes (this one node 0)' '$TMP/mpi-shared.out' && grep -q 'creating one client across 2 processes (this one node 1)' '$TMP/mpi-shared.out'"
else
  bad "mpirun not found: make setup installs openmpi-bin"
fi

# The executable cache keys XLA_FLAGS (docs/runtime.md, "Executable cache"):
# a run under --xla_cpu_max_isa=AVX2 compiles its own executables instead
# of loading the default flags' (which would hide another CPU's code
# paths), and a run without the variable finds the first entries again.
XC="$TMP/cache-xla-flags"
STRATA_CACHE_DIR="$XC" "$STRATA" train configs/test.yml train.steps=1 run.dir="$TMP/xf-a" run.progress=off >/dev/null 2>&1
n1=$(ls "$XC/executables" 2>/dev/null | grep -c '\.xexe$')
STRATA_CACHE_DIR="$XC" XLA_FLAGS=--xla_cpu_max_isa=AVX2 "$STRATA" train configs/test.yml train.steps=1 run.dir="$TMP/xf-b" run.progress=off >/dev/null 2>&1
n2=$(ls "$XC/executables" 2>/dev/null | grep -c '\.xexe$')
STRATA_CACHE_DIR="$XC" "$STRATA" train configs/test.yml train.steps=1 run.dir="$TMP/xf-c" run.progress=off >/dev/null 2>&1
n3=$(ls "$XC/executables" 2>/dev/null | grep -c '\.xexe$')
# (Not exactly twice: the first run also caches doctor's matmul peak probe.)
check "XLA_FLAGS in the executable cache key: $n1 entries, $n2 after an AVX2 run, $n3 after a plain run again" \
  "[ $n1 -gt 1 ] && [ $n2 -ge \$((2 * $n1 - 1)) ] && [ $n3 = $n2 ]"

finish test_train.sh
