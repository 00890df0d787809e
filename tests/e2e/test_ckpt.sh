#!/usr/bin/env bash
# test_ckpt.sh — checkpoints, resume and recovery end to end (issue 5), on
# the real trainer, CPU plugin, files, processes and signals:
#   1. determinism first: an uninterrupted run repeated is bitwise identical
#   2. kill drill: >= 10 SIGKILLs at random moments (mid-step, mid-save,
#      seeds printed), each resumed; final params bitwise identical to the
#      uninterrupted run, every replayed step's loss identical
#   3. corruption matrix: each corruption detected by `strata ckpt verify`
#      naming file and tensor; `strata resume` skips it, says why, falls back
#   4. I/O faults: injected ENOSPC/EIO and a really full tmpfs; the previous
#      checkpoint verifies; ckpt.on_error=continue|stop decides
#   5. supervisor drills under `strata run`: crash at step 37 of 60, crash in
#      a save, corrupt newest + crash, hang, give-up, no restart of config
#      errors; recovery.json and events
# Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=$(realpath "${PY:-.venv/bin/python}")
VENV_PY="$PWD/.venv/bin/python" # not resolved: the virtualenv's packages (tensorboard)
DRILL="$PY $(realpath tests/e2e/ckpt_drill.py)"
TMP=$(mktemp -d /tmp/strata-e2e-ckpt-XXXXXX)
MNT=""
cleanup() {
  [ -n "$MNT" ] && umount "$MNT" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
# One cache for the whole file: compiled once, every restart loads it.
# The cache of the whole make test when run_all.sh shares one (tests/README.md, "Time"); alone, a private one.
[ "${STRATA_E2E_SHARED_CACHE:-0}" = 1 ] || export STRATA_CACHE_DIR="$TMP/cache"

source "$(dirname "$0")/lib.sh"

# Deterministic, one device (docs/runtime.md): bitwise-repeatable steps.
BASE=(configs/test.yml runtime.deterministic=true runtime.cpu_devices=1 run.progress=off)
R60=("${BASE[@]}" train.steps=60)
train() { "$STRATA" train "$@" >/dev/null 2>>"$TMP/train.log"; }

# --- 1. determinism: the reference, twice ----------------------------------------
train "${R60[@]}" ckpt.every=10 run.dir="$TMP/ref" && ok || bad "reference run failed: $(tail -3 "$TMP/train.log")"
train "${R60[@]}" ckpt.every=10 run.dir="$TMP/ref2" && ok || bad "second reference run failed"
check "an uninterrupted run repeated is bitwise identical" "cmp -s '$TMP/ref/params.safetensors' '$TMP/ref2/params.safetensors'"
check "... including the optimizer state of its final checkpoint" \
  "cmp -s '$TMP/ref/checkpoints/step_60/optimizer.safetensors' '$TMP/ref2/checkpoints/step_60/optimizer.safetensors'"
# ckpt.staging (issue 18): auto is chunked on the CPU plugin (the saves above
# streamed one tensor at a time); a full host copy written on the writer
# thread must give the very same checkpoint files.
train "${R60[@]}" ckpt.every=10 ckpt.staging=full run.dir="$TMP/full" && ok || bad "ckpt.staging=full run failed"
check "ckpt.staging: chunked (auto on CPU) and full write bitwise identical checkpoints" \
  "(for s in 50 60; do for f in params optimizer; do cmp -s '$TMP/ref/checkpoints/step_'\$s/\$f.safetensors '$TMP/full/checkpoints/step_'\$s/\$f.safetensors || exit 1; done; done) && grep '\"ckpt_saved\"' '$TMP/ref/events.jsonl' | grep -q '\"staging\": \"chunked\"' && grep '\"ckpt_saved\"' '$TMP/full/events.jsonl' | grep -q '\"staging\": \"full\"'"
check "memory events: at the start and at the peak, by category, and the staging the run held" "$PY - '$TMP/ref/events.jsonl' '$TMP/full/events.jsonl' <<'PYEOF'
import json, sys
def mem(path):
    ev = [json.loads(l) for l in open(path)]
    m = {e['phase']: e for e in ev if e['event'] == 'memory'}
    assert set(m) == {'start', 'peak'}, m.keys()
    assert m['peak']['rss_bytes'] >= m['start']['rss_bytes'] and m['peak']['hwm_bytes'] >= m['peak']['rss_bytes'], m
    for e in m.values():
        c = e['categories']
        assert {'baseline', 'plugin', 'executables', 'device_buffers', 'ckpt_staging', 'malloc_free_held', 'other'} <= set(c), c
        assert e['rss_bytes'] > 0 and c['device_buffers'] > 0 and e['device_memory_is_host'], e
        assert e['rss_bytes'] == sum(c.values()), e
    return m
chunked, full = mem(sys.argv[1]), mem(sys.argv[2])
state = full['peak']['ckpt_staging_save_bytes']
# full: the whole state staged once saved; chunked: the largest tensor, never the whole state
assert full['peak']['categories']['ckpt_staging'] == state > 0, full['peak']
assert chunked['peak']['ckpt_staging_save_bytes'] < state, chunked['peak']
PYEOF"
check "metrics carry per-save numbers" "grep -q '\"ckpt_blocking_s\"' '$TMP/ref/metrics.jsonl' && grep -q '\"mb_per_s\"' '$TMP/ref/events.jsonl'"
check "retention keeps the newest 3 (ckpt.keep)" "[ \"\$(ls '$TMP/ref/checkpoints' | tr '\n' ' ')\" = 'LATEST step_40 step_50 step_60 ' ]"
expect_exit 0 "all 3 checkpoints verified" ckpt verify "$TMP/ref"
expect_exit 0 "step 60, 60 tensors in 2 files" ckpt verify "$TMP/ref/checkpoints/step_60"
expect_exit 0 "LATEST" ckpt list "$TMP/ref"
# LATEST is data, not a path: one that names no checkpoint folder of the run is flagged by list and fails verify
mkdir -p "$TMP/lat" && cp -a "$TMP/ref/checkpoints" "$TMP/lat/"
echo "../../../etc" >"$TMP/lat/checkpoints/LATEST"
expect_exit 0 "LATEST: \\.\\./\\.\\./\\.\\./etc, INVALID" ckpt list "$TMP/lat"
expect_exit 7 "LATEST in .* names no checkpoint of it" ckpt verify "$TMP/lat"
check "verify says why LATEST is wrong" "grep -q \"LATEST is '../../../etc': not a checkpoint name\" '$TMP/out'"
echo "step_999" >"$TMP/lat/checkpoints/LATEST"
expect_exit 7 "LATEST in .* names no checkpoint of it" ckpt verify "$TMP/lat"
check "verify says LATEST names a missing folder" "grep -q \"LATEST is 'step_999': names no checkpoint folder\" '$TMP/out'"
expect_exit 0 "layers.1.w_down .*F32 .*\\[64,32\\]" ckpt inspect "$TMP/ref/checkpoints/step_60"
expect_exit 0 "data position   240 sequences" ckpt inspect "$TMP/ref/checkpoints/step_60"
expect_exit 2 "already holds a run .*strata resume $TMP/ref" train "${R60[@]}" run.dir="$TMP/ref"
expect_exit 2 "usage: strata ckpt" ckpt frobnicate "$TMP/ref"
expect_exit 2 "is not a run directory" resume "$TMP/nowhere"
cp -a "$TMP/ref2" "$TMP/done"
expect_exit 0 "resuming from .*step_60 \\(step 60\\)" resume "$TMP/done"
check "resuming a finished run changes nothing, events stay JSON" "cmp -s '$TMP/ref/params.safetensors' '$TMP/done/params.safetensors' && $PY -c '
import json, sys
[json.loads(l) for l in open(sys.argv[1])]' '$TMP/done/events.jsonl'"
check "a resume from a checkpoint compiles no init program (it restores every slot)" "$PY - '$TMP/done/events.jsonl' <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
compiles = [e for e in ev if e['event'] == 'compile']
assert len(compiles) == 2, len(compiles)
first, resumed = compiles[0]['program_seconds'], compiles[1]['program_seconds']
assert 'block_init' in first and 'block_fwd' in first, first
assert not [p for p in resumed if p.endswith('_init')] and 'block_fwd' in resumed, resumed
PYEOF"
# run.resume=true with no checkpoint yet: the init programs are compiled late.
train "${R60[@]}" ckpt.every=10 run.resume=true run.dir="$TMP/fresh-resume" && ok || bad "run.resume=true on a new run.dir failed"
check "run.resume=true without a checkpoint trains like a fresh run (bitwise)" \
  "cmp -s '$TMP/ref/params.safetensors' '$TMP/fresh-resume/params.safetensors' && grep -q '\"from_step\": 0' '$TMP/fresh-resume/events.jsonl'"

# --- 1b. one process per run directory ------------------------------------------
# A second process on a live run directory is refused (exit 2, naming the
# holder's pid) and writes nothing there; SIGKILL releases the lock at once.
"$STRATA" train "${BASE[@]}" train.steps=100000 ckpt.every=0 run.dir="$TMP/busy" >/dev/null 2>"$TMP/busy.err" &
BUSY=$!
for _ in $(seq 600); do grep -q '"event": "run"' "$TMP/busy/events.jsonl" 2>/dev/null && break; sleep 0.1; done
cp "$TMP/busy/config.yaml" "$TMP/busy.config"
expect_exit 2 "run directory .*busy' is in use by another strata process \\(pid $BUSY holds" resume "$TMP/busy" train.steps=5
expect_exit 2 "is in use by another strata process \\(pid $BUSY" train "${BASE[@]}" train.steps=5 run.dir="$TMP/busy"
cp "$TMP/busy/events.jsonl" "$TMP/busy.events"
expect_exit 2 "is in use by another strata process \\(pid $BUSY" run "${BASE[@]}" train.steps=5 run.dir="$TMP/busy" run.resume=true
check "the refused processes did not touch the live run's config.yaml" "cmp -s '$TMP/busy.config' '$TMP/busy/config.yaml'"
check "the refused supervisor wrote no event into the live run's events.jsonl" \
  "! grep -q supervisor_start '$TMP/busy/events.jsonl' && head -c \$(stat -c %s '$TMP/busy.events') '$TMP/busy/events.jsonl' | cmp -s - '$TMP/busy.events'"
kill -9 "$BUSY"
wait "$BUSY" 2>/dev/null
expect_exit 0 "no checkpoint in .* yet; starting from step 0" resume "$TMP/busy" train.steps=3
check "every metrics line of the killed and the resumed run is whole JSON" "$PY -c '
import json, sys
[json.loads(l) for l in open(sys.argv[1])]' '$TMP/busy/metrics.jsonl'"

# --- 2. kill drill --------------------------------------------------------------
SEED=${STRATA_DRILL_SEED:-$((RANDOM * 32768 + RANDOM))}
echo "kill drill seed: $SEED (rerun with STRATA_DRILL_SEED=$SEED)"
# 120 steps: room for 10 attempts that each get a few steps further.
train "${BASE[@]}" train.steps=120 ckpt.every=5 run.dir="$TMP/ref120" && ok || bad "120-step reference run failed"
if $DRILL kill --strata "$STRATA" --dir "$TMP/kill" --kills 10 --seed "$SEED" "${BASE[@]}" train.steps=120 ckpt.every=5 ckpt.keep=2; then
  ok
else
  bad "kill drill: the final resume failed: $(tail -5 "$TMP/kill.log")"
fi
check "kill drill: >= 10 SIGKILLs, some mid-step and some mid-save" "$PY - '$TMP/kill.kills.json' <<'PYEOF'
import json, sys
k = json.load(open(sys.argv[1]))
assert k['kills'] >= 10 and k['mid_step'] >= 1 and k['mid_save'] >= 1, k
PYEOF"
check "kill drill: final params bitwise identical, replayed losses identical" \
  "$DRILL same '$TMP/ref120' '$TMP/kill' --final step_120 --min-replayed 1"
check "kill drill: every resume is in events.jsonl" "[ \$(grep -c '\"event\": \"resumed\"' '$TMP/kill/events.jsonl') -ge 10 ]"
check "kill drill: partial saves were found and removed" "grep -q ckpt_temporaries_removed '$TMP/kill/events.jsonl' && [ -z \"\$(ls -A '$TMP/kill/checkpoints' | grep '^\\.tmp')\" ]"

# --- 3. corruption matrix -------------------------------------------------------
R20=("${BASE[@]}" train.steps=20 ckpt.every=5 ckpt.keep=10)
train "${R20[@]}" run.dir="$TMP/c20" && ok || bad "corruption reference run failed"
train "${BASE[@]}" train.steps=20 ckpt.every=5 model.d_model=64 run.dir="$TMP/other" && ok || bad "other-model run failed"
# corrupt NAME PATTERN COMMAND [model]: copies the run, applies COMMAND in
# its step_20; `strata ckpt verify` must fail naming PATTERN (for "model":
# the checkpoint is valid in itself, only a run of this model can tell, so
# verify passes), and resume must skip step_20 saying why, fall back to
# step_15 and end bitwise identical to the uninterrupted run.
corrupt() {
  local name=$1 pat=$2 cmd=$3 kind=${4:-}
  local d="$TMP/cm-$name"
  cp -a "$TMP/c20" "$d"
  (cd "$d/checkpoints/step_20" && eval "$cmd")
  if [ "$kind" = model ]; then
    expect_exit 0 "OK .*step_20" ckpt verify "$d/checkpoints/step_20"
  else
    expect_exit 7 "$pat" ckpt verify "$d/checkpoints/step_20"
    expect_exit 7 "1 of 4 checkpoints in .* are invalid" ckpt verify "$d"
  fi
  if "$STRATA" resume "$d" >"$TMP/out" 2>"$TMP/err"; then ok; else bad "$name: resume exited $?: $(tail -3 "$TMP/err")"; fi
  check "$name: resume says it skipped step_20 and why" "grep -Eq -- \"skipping checkpoint step_20: .*\$pat\" '$TMP/err'"
  check "$name: resume fell back to step_15" "grep -q 'resuming from .*step_15 (step 15)' '$TMP/err'"
  check "$name: the skip is an event with its reason" "grep -q '\"ckpt_skipped\", \"checkpoint\": \"step_20\"' '$d/events.jsonl'"
  check "$name: final params identical to the uninterrupted run" "cmp -s '$TMP/c20/params.safetensors' '$d/params.safetensors'"
}
corrupt truncated "optimizer.safetensors: truncated: [0-9]+ of [0-9]+ bytes" \
  "$PY -c 'import os; n=os.path.getsize(\"optimizer.safetensors\"); os.truncate(\"optimizer.safetensors\", n // 2)'"
corrupt flipped "params.safetensors: tensor '[^']+': checksum mismatch" \
  "$PY -c 'b=bytearray(open(\"params.safetensors\",\"rb\").read()); b[-100]^=1; open(\"params.safetensors\",\"wb\").write(b)'"
corrupt no-manifest "manifest.json' is missing" "rm manifest.json"
corrupt bad-manifest "manifest.json' is malformed" "head -c 200 manifest.json > m && mv m manifest.json"
corrupt edited-manifest "manifest.json' fails its checksum" "sed -i 's/\"step\": 20,/\"step\": 21,/' manifest.json"
corrupt shape "params.safetensors: tensor 'layers.0.w_down' is f32\\[32,64\\] in the file but f32\\[64,32\\] in the manifest" \
  "$DRILL shape params.safetensors '\"layers.0.w_down\": {\"dtype\": \"F32\", \"shape\": [64, 32]' '\"layers.0.w_down\": {\"dtype\": \"F32\", \"shape\": [32, 64]'"
corrupt dtype "params.safetensors: tensor 'wte' is s32\\[256,32\\] in the file but f32\\[256,32\\] in the manifest" \
  "$DRILL shape params.safetensors '\"wte\": {\"dtype\": \"F32\"' '\"wte\": {\"dtype\": \"I32\"'"
corrupt other-bundle "written with bundle 0123456789abcdef, this run uses bundle" "$DRILL fixmanifest . bundle_key '\"0123456789abcdef\"'" model
corrupt other-model "identity mismatch: model.d_model 64 in the checkpoint, 32 given" \
  "rm -rf ./* && cp -a '$TMP/other/checkpoints/step_20/.' ." model
corrupt missing-file "params.safetensors: tensor file is missing" "rm params.safetensors"
# every count in a manifest is bounded (docs/checkpoints.md "Limits")
FILES17=$($PY -c 'import json; print(json.dumps([{"file": "f%d" % i, "bytes": 0, "xxh64": "0" * 16} for i in range(17)]))')
corrupt too-many-files "lists 17 files, above the limit of 16 \\(ST_CKPT_MAX_FILES\\)" "$DRILL fixmanifest . files '$FILES17'"
# ckpt.allow_bundle_change accepts the other bundle's checkpoint (same model and tensors), with a warning
cp -a "$TMP/c20" "$TMP/cm-allow"
(cd "$TMP/cm-allow/checkpoints/step_20" && $DRILL fixmanifest . bundle_key '"0123456789abcdef"')
if "$STRATA" resume "$TMP/cm-allow" ckpt.allow_bundle_change=true >/dev/null 2>"$TMP/err"; then ok; else bad "resume with allow_bundle_change exited $?"; fi
check "allow_bundle_change: resumes from step_20, says the bundle differs" \
  "grep -q 'written with bundle 0123456789abcdef, this run uses .*allowed by ckpt.allow_bundle_change' '$TMP/err' && grep -q 'resuming from .*step_20 (step 20)' '$TMP/err'"
# a checkpoint names logical slots, not offload homes: one written without
# offload resumes under sched.offload=both
("$STRATA" train "${R20[@]}" run.dir="$TMP/xpol" faults.crash_at_step=12 >/dev/null 2>&1; echo $? >"$TMP/rc") 2>/dev/null
check "crash_at_step exits by SIGKILL (137)" "[ \$(cat '$TMP/rc') = 137 ]"
if "$STRATA" resume "$TMP/xpol" sched.offload=both >/dev/null 2>"$TMP/err"; then ok; else bad "resume under sched.offload=both exited $?: $(tail -3 "$TMP/err")"; fi
check "resumed under another offload policy: bitwise identical" "cmp -s '$TMP/c20/params.safetensors' '$TMP/xpol/params.safetensors'"
# nothing valid left: refuse, never load corrupt data
cp -a "$TMP/c20" "$TMP/cm-all"
for s in 5 10 15 20; do rm "$TMP/cm-all/checkpoints/step_$s/manifest.json"; done
expect_exit 7 "no valid checkpoint in .*all 4 were skipped" resume "$TMP/cm-all"

# --- 4. I/O faults ----------------------------------------------------------------
R30=("${BASE[@]}" train.steps=30 ckpt.every=5)
train "${R30[@]}" run.dir="$TMP/io-ref" && ok || bad "io reference run failed"
expect_exit 0 "FAULT INJECTED: io_error_at_save=2: .*No space left on device" \
  train "${R30[@]}" run.dir="$TMP/io-cont" faults.io_error_at_save=2 ckpt.on_error=continue
check "ENOSPC, continue: the failure is an event" "grep -q '\"ckpt_failed\", \"step\": 10, \"error\": \".*No space left on device' '$TMP/io-cont/events.jsonl'"
check "ENOSPC, continue: training went on to the end, identical" "cmp -s '$TMP/io-ref/params.safetensors' '$TMP/io-cont/params.safetensors'"
expect_exit 0 "OK .*step_30" ckpt verify "$TMP/io-cont/checkpoints/step_30"
check "ENOSPC, continue: no partial folder left" "[ -z \"\$(ls -A '$TMP/io-cont/checkpoints' | grep '^\\.tmp')\" ]"
expect_exit 7 "checkpoint step_10: writing .*Input/output error.*ckpt.on_error=stop" \
  train "${R30[@]}" run.dir="$TMP/io-stop" faults.io_error_at_save=2 faults.io_error=EIO
expect_exit 0 "OK .*step_5" ckpt verify "$TMP/io-stop/checkpoints/step_5"
check "EIO, stop: LATEST still names the previous checkpoint" "[ \"\$(cat '$TMP/io-stop/checkpoints/LATEST')\" = step_5 ]"
check "EIO, stop: the failure is in events.jsonl with the exit code" "grep -q '\"ckpt_failed\"' '$TMP/io-stop/events.jsonl' && grep -q '\"exit_code\": 7' '$TMP/io-stop/events.jsonl'"
if "$STRATA" resume "$TMP/io-stop" >/dev/null 2>"$TMP/err"; then ok; else bad "resume after EIO stop exited $?"; fi
check "EIO, stop, resumed: identical to the uninterrupted run" "cmp -s '$TMP/io-ref/params.safetensors' '$TMP/io-stop/params.safetensors'"

# A really full file system: a 600 KiB tmpfs under checkpoints/ holds one
# checkpoint (~355 KiB) but not a second one next to it.
full_fs() { # NAME ON_ERROR
  local d="$TMP/full-$1"
  mkdir -p "$d/checkpoints"
  if ! mount -t tmpfs -o size=600k tmpfs "$d/checkpoints" 2>"$TMP/mount.err"; then
    return 1
  fi
  MNT="$d/checkpoints"
  "$STRATA" train "${R30[@]}" run.dir="$d" ckpt.keep=1 ckpt.on_error="$2" >"$TMP/out" 2>"$TMP/err"
  echo $? >"$TMP/rc"
  return 0
}
if full_fs stop stop; then
  check "full tmpfs, stop: exit 7" "[ \$(cat '$TMP/rc') = 7 ]"
  check "full tmpfs, stop: the error is ENOSPC from the kernel, naming the file" "grep -q 'writing .*safetensors.* failed: No space left on device' '$TMP/err'"
  expect_exit 0 "OK .*step_5" ckpt verify "$TMP/full-stop/checkpoints/step_5"
  check "full tmpfs, stop: the failed save's partial folder is gone" "[ -z \"\$(ls -A '$TMP/full-stop/checkpoints' | grep '^\\.tmp')\" ]"
  umount "$MNT" && MNT=""
  full_fs cont continue
  check "full tmpfs, continue: the run finishes (exit 0)" "[ \$(cat '$TMP/rc') = 0 ]"
  check "full tmpfs, continue: every later save failed and was logged" "[ \$(grep -c '\"ckpt_failed\"' '$TMP/full-cont/events.jsonl') -ge 5 ]"
  check "full tmpfs, continue: the final one too, loudly" "grep -q 'ends without its final checkpoint' '$TMP/err'"
  expect_exit 0 "OK .*step_5" ckpt verify "$TMP/full-cont/checkpoints/step_5"
  check "full tmpfs, continue: params identical anyway" "cmp -s '$TMP/io-ref/params.safetensors' '$TMP/full-cont/params.safetensors'"
  umount "$MNT" && MNT=""
else
  echo "NOTE: cannot mount a size-limited tmpfs here ($(cat "$TMP/mount.err")); the full-disk case is covered by the injected ENOSPC above only"
fi

# A full disk under the run log itself: metrics.jsonl / events.jsonl on a
# 48 KiB tmpfs. The failed append exits 9 (file system) and leaves whole
# lines only; with room again, resume appends cleanly.
if mkdir -p "$TMP/full-log" && mount -t tmpfs -o size=48k tmpfs "$TMP/full-log" 2>"$TMP/mount.err"; then
  MNT="$TMP/full-log"
  "$STRATA" train "${BASE[@]}" train.steps=100000 ckpt.every=0 run.dir="$TMP/full-log" >/dev/null 2>"$TMP/err"
  rc=$?
  # The TensorBoard file (tb/, docs/using.md) shares the disk: whichever
  # append finds it full fails, and names its file.
  check "full disk under metrics.jsonl: exit 9 (rc $rc), naming the file and ENOSPC" \
    "[ $rc = 9 ] && grep -Eq 'i/o error: .*writing ((metrics|events)\.jsonl|TensorBoard events to .*tb/events\.out\.tfevents\.[^ ]*) failed: No space left on device' '$TMP/err'"
  check "full disk: no torn line in metrics.jsonl or events.jsonl" "$PY - '$TMP/full-log' <<'PYEOF'
import json, sys
for name in ('metrics.jsonl', 'events.jsonl'):
    data = open(sys.argv[1] + '/' + name).read()
    assert data.endswith('\\n'), (name, data[-80:])
    [json.loads(l) for l in data.splitlines()]
PYEOF"
  tb_whole() { # every tb/ file is whole records, CRCs checked with TensorBoard's own CRC-32C
    "$VENV_PY" - "$1" <<'PYEOF'
import glob, struct, sys
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
files = sorted(glob.glob(sys.argv[1] + '/tb/events.out.tfevents.*'))
assert files
for f in files:
    data, at, n = open(f, 'rb').read(), 0, 0
    while at < len(data):
        (length,) = struct.unpack_from('<Q', data, at)
        end = at + 12 + length + 4
        assert end <= len(data), (f, 'torn record at', at)
        assert struct.unpack_from('<I', data, end - 4)[0] == masked_crc32c(data[at + 12:end - 4]), (f, at)
        at, n = end, n + 1
    assert n >= 1, f
print(len(files))
PYEOF
  }
  check "full disk: no torn record in tb/" "tb_whole '$TMP/full-log' >/dev/null"
  n=$(grep -c '"loss"' "$TMP/full-log/metrics.jsonl")
  mount -o remount,size=4m "$TMP/full-log"
  if "$STRATA" resume "$TMP/full-log" train.steps=$((n + 2)) >/dev/null 2>"$TMP/err"; then ok; else bad "resume after the full disk exited $?: $(tail -2 "$TMP/err")"; fi
  check "full disk, then room again: resume appends whole lines" "$PY -c '
import json, sys
[json.loads(l) for f in sys.argv[1:] for l in open(f)]' '$TMP/full-log/metrics.jsonl' '$TMP/full-log/events.jsonl'"
  check "full disk, then room again: the resume added a tb/ file of whole records" "[ \"\$(tb_whole '$TMP/full-log')\" = 2 ]"
  umount "$MNT" && MNT=""
else
  echo "NOTE: cannot mount a size-limited tmpfs here ($(cat "$TMP/mount.err")); the full run-log disk case is not covered"
fi
# A torn last line (a write cut short, e.g. by a power loss) is cut on resume
# before anything is appended, in metrics.jsonl and in events.jsonl.
cp -a "$TMP/ref" "$TMP/torn"
printf '{"step": 61, "loss": 1.23' >>"$TMP/torn/metrics.jsonl"
printf '{"time": 1.0, "event": "ru' >>"$TMP/torn/events.jsonl"
if "$STRATA" resume "$TMP/torn" train.steps=62 >/dev/null 2>"$TMP/err"; then ok; else bad "resume over torn lines exited $?: $(tail -2 "$TMP/err")"; fi
check "torn lines: resume warns, cuts them (log_repaired events) and appends whole lines" \
  "grep -q 'metrics.jsonl ended in a torn line (25 bytes' '$TMP/err' && grep -q 'events.jsonl ended in a torn line (26 bytes' '$TMP/err' && $PY - '$TMP/torn' <<'PYEOF'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1] + '/metrics.jsonl')]
e = [json.loads(l) for l in open(sys.argv[1] + '/events.jsonl')]
assert [l['step'] for l in m if 'loss' in l] == list(range(1, 63))
rep = [(x['file'], x['cut_bytes']) for x in e if x['event'] == 'log_repaired']
assert rep == [('events.jsonl', 26), ('metrics.jsonl', 25)], rep
PYEOF"

# --- 5. supervisor drills -------------------------------------------------------
SUP=("${R60[@]}" ckpt.every=10 recovery.backoff_s=0.05)
if "$STRATA" run "${SUP[@]}" faults.crash_at_step=37 run.dir="$TMP/sup" >"$TMP/out" 2>"$TMP/err"; then ok; else bad "strata run (crash at 37) exited $?: $(tail -3 "$TMP/err")"; fi
check "supervised crash at 37: final params bitwise identical" "$DRILL same '$TMP/ref' '$TMP/sup' --final step_60 --min-replayed 6"
check "supervised crash at 37: recovery.json has one restart, steps lost <= ckpt.every" "$PY - '$TMP/sup/recovery.json' <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
print('  recovery.json:', {k: r[k] for k in ('outcome', 'restarts', 'mttr_s', 'mean_detection_s', 'mean_restore_s', 'mean_rto_s', 'max_steps_lost')})
assert r['outcome'] == 'completed' and r['exit_code'] == 0 and r['restarts'] == 1 and r['attempts'] == 2, r
i = r['incidents'][0]
assert i['signal'] == 9 and i['last_step'] == 36 and i['from_step'] == 30 and i['steps_lost'] == 6 <= 10, i
assert i['recovered'] and 0 <= i['detection_s'] < 5 and i['restore_s'] > 0 and i['rto_s'] >= i['restart_s'] >= 0.05, i
assert r['max_steps_lost'] == 6 and r['mttr_s'] > 0
PYEOF"
check "supervised: incident, restart and recovered events" "grep -q '\"incident\"' '$TMP/sup/events.jsonl' && grep -q '\"event\": \"restart\"' '$TMP/sup/events.jsonl' && grep -q '\"event\": \"recovered\"' '$TMP/sup/events.jsonl' && tail -1 '$TMP/sup/events.jsonl' | grep -q supervisor_done"
check "supervised: armed faults are announced" "grep -q 'FAULT INJECTION ARMED: crash_at_step=37' '$TMP/err' && grep -q '\"faults_armed\"' '$TMP/sup/events.jsonl'"

if "$STRATA" run "${SUP[@]}" faults.crash_in_save=3 run.dir="$TMP/sup-save" >/dev/null 2>"$TMP/err"; then ok; else bad "strata run (crash in save) exited $?"; fi
check "supervised crash in the 3rd save: identical, one restart" "$DRILL same '$TMP/ref' '$TMP/sup-save' --final step_60 >/dev/null && grep -q '\"restarts\": 1,' '$TMP/sup-save/recovery.json'"
check "supervised crash in save: killed halfway through a tensor file" "grep -q 'FAULT INJECTED: crash_in_save=3: SIGKILL halfway through writing .*/.tmp-step_30-' '$TMP/err'"

if "$STRATA" run "${SUP[@]}" faults.corrupt_latest=3 faults.crash_at_step=37 run.dir="$TMP/sup-corrupt" >/dev/null 2>"$TMP/err"; then ok; else bad "strata run (corrupt + crash) exited $?"; fi
check "corrupt newest + crash: step_30 skipped, resumed from step_20, identical" "grep -q 'skipping checkpoint step_30: .*checksum mismatch' '$TMP/err' && grep -q 'resuming from .*step_20' '$TMP/err' && $DRILL same '$TMP/ref' '$TMP/sup-corrupt' >/dev/null"

if "$STRATA" run "${SUP[@]}" faults.hang_at_step=25 recovery.hang_timeout_s=2 run.dir="$TMP/sup-hang" >/dev/null 2>"$TMP/err"; then ok; else bad "strata run (hang) exited $?"; fi
check "hang: killed after recovery.hang_timeout_s and restarted, identical" "grep -q '\"cause\": \"hang: no progress' '$TMP/sup-hang/recovery.json' && $DRILL same '$TMP/ref' '$TMP/sup-hang' >/dev/null"

expect_exit 1 "max_restarts reached, giving up" run "${SUP[@]}" faults.crash_at_step=12 faults.repeat=true recovery.max_restarts=2 recovery.backoff_s=0 run.dir="$TMP/sup-giveup"
check "give up: outcome, 3 attempts, 2 restarts" "grep -q '\"outcome\": \"gave_up\"' '$TMP/sup-giveup/recovery.json' && grep -q '\"attempts\": 3,' '$TMP/sup-giveup/recovery.json' && grep -q '\"restarts\": 2,' '$TMP/sup-giveup/recovery.json'"
expect_exit 3 "not restarting" run "${SUP[@]}" data.synthetic=false data.path=/nonexistent/corpus run.dir="$TMP/sup-data"
check "a data error is not restarted" "grep -q '\"outcome\": \"not_restartable\"' '$TMP/sup-data/recovery.json' && grep -q '\"attempts\": 1,' '$TMP/sup-data/recovery.json'"
# ... and leaves an empty run, which strata run may use again.
if "$STRATA" run "${BASE[@]}" train.steps=3 run.dir="$TMP/sup-data" >/dev/null 2>"$TMP/err"; then ok; else bad "strata run reusing the empty run of a data error exited $?: $(tail -2 "$TMP/err")"; fi
expect_exit 2 "already holds a run" run "${SUP[@]}" run.dir="$TMP/sup"
# SIGTERM to the supervisor: forwarded to the child, no restart
"$STRATA" run "${SUP[@]}" faults.hang_at_step=5 run.dir="$TMP/sup-term" >/dev/null 2>"$TMP/err" &
sup_pid=$!
for _ in $(seq 1 300); do grep -q hang_at_step "$TMP/sup-term/diag/faults.fired" 2>/dev/null && break; sleep 0.05; done
kill -TERM "$sup_pid"
wait "$sup_pid"
check "SIGTERM: the supervisor stops the child and does not restart it" "grep -q '\"outcome\": \"interrupted\"' '$TMP/sup-term/recovery.json' && grep -q '\"attempts\": 1,' '$TMP/sup-term/recovery.json' && grep -q 'stopped by signal 15; not restarting' '$TMP/err'"

# --- 6. stopping by signal: finish the step, checkpoint, exit 8 -------------------
# wait_for FILE PATTERN: up to 60 s for a line matching PATTERN in FILE.
wait_for() { for _ in $(seq 600); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
# steps_in DIR: the number of step lines in DIR/metrics.jsonl.
steps_in() {
  local n
  n=$(grep -c '"loss"' "$1/metrics.jsonl" 2>/dev/null)
  echo "${n:-0}"
}
wait_steps() { for _ in $(seq 600); do [ "$(steps_in "$1")" -ge "$2" ] && return 0; sleep 0.1; done; return 1; }
# last_step DIR: the step of the last step line.
last_step() { grep '"loss"' "$1/metrics.jsonl" | tail -1 | sed 's/^{"step": \([0-9]*\),.*/\1/'; }
LONG=("${BASE[@]}" train.steps=100000 ckpt.every=0)
for sig in TERM INT HUP; do
  d="$TMP/stop-$sig"
  "$STRATA" train "${LONG[@]}" run.dir="$d" >/dev/null 2>"$TMP/stop.err" &
  pid=$!
  wait_steps "$d" 5 || bad "SIG$sig: the run did not reach step 5"
  kill -"$sig" "$pid"
  wait "$pid"
  rc=$?
  n=$(last_step "$d")
  check "SIG$sig: exit 8 (rc $rc), stderr says where it stopped" "[ $rc = 8 ] && grep -q 'stopped by SIG$sig after step $n, checkpoint step_$n written; continue with .strata resume $d.' '$TMP/stop.err'"
  check "SIG$sig: the final event is 'interrupted' with the signal, the step and the checkpoint" \
    "tail -1 '$d/events.jsonl' | grep -q '\"event\": \"interrupted\", \"signal\": [0-9]*, \"signal_name\": \"SIG$sig\", \"step\": $n, \"checkpoint\": \"step_$n\", \"exit_code\": 8'"
  check "SIG$sig: a checkpoint of the last recorded step, LATEST names it, it verifies" \
    "[ \"\$(cat '$d/checkpoints/LATEST')\" = step_$n ] && '$STRATA' ckpt verify '$d/checkpoints/step_$n' >/dev/null 2>&1"
done
# SIGTERM during a cold export (its own empty cache: the exporter runs for
# seconds): acted on at once, not after the export and compile; exit 8, the
# exporter's half-written bundle folder removed.
d="$TMP/stop-export"
STRATA_CACHE_DIR="$TMP/cache-cold" "$STRATA" train "${LONG[@]}" run.dir="$d" >/dev/null 2>"$TMP/stop.err" &
pid=$!
for _ in $(seq 600); do ls -d "$TMP"/cache-cold/bundles/*.tmp-* >/dev/null 2>&1 && break; sleep 0.05; done
ls -d "$TMP"/cache-cold/bundles/*.tmp-* >/dev/null 2>&1 || bad "the cold run's exporter did not start writing"
t0=$SECONDS
kill -TERM "$pid"
wait "$pid"
rc=$?
check "SIGTERM during a cold export: exit 8 within 10 s (rc $rc, $((SECONDS - t0)) s), the exporter ended, no step" \
  "[ $rc = 8 ] && [ $((SECONDS - t0)) -le 10 ] && grep -q 'exporting the bundle: stopped by signal 15' '$TMP/stop.err' && [ ! -s '$d/metrics.jsonl' ]"
check "... the final event is 'interrupted' naming SIGTERM, no half-written bundle folder left" \
  "tail -1 '$d/events.jsonl' | grep -q '\"event\": \"interrupted\", \"signal\": 15, \"signal_name\": \"SIGTERM\"' && ! ls -d '$TMP'/cache-cold/bundles/*.tmp-* >/dev/null 2>&1"

d="$TMP/stop-TERM"
n=$(last_step "$d")
if "$STRATA" resume "$d" train.steps=$((n + 3)) >/dev/null 2>"$TMP/err"; then ok; else bad "resume after SIGTERM exited $?: $(tail -2 "$TMP/err")"; fi
check "resume after SIGTERM: goes on from step_$n, every step once" "grep -q 'resuming from .*step_$n (step $n)' '$TMP/err' && $PY - '$d/metrics.jsonl' $((n + 3)) <<'PYEOF'
import json, sys
steps = [l['step'] for l in map(json.loads, open(sys.argv[1])) if 'loss' in l]
assert steps == list(range(1, int(sys.argv[2]) + 1)), steps
PYEOF"
# A second signal during the stop's checkpoint aborts at once; the previous
# checkpoint stays valid. faults.hang_in_save=1 holds the stop's save (the
# first of the attempt: ckpt.every=0) halfway through its first file.
prev=$((n + 3))
"$STRATA" resume "$d" train.steps=100000 faults.hang_in_save=1 >/dev/null 2>"$TMP/stop2.err" &
pid=$!
wait_steps "$d" $((prev + 3)) || bad "the second attempt did not run"
kill -TERM "$pid"
wait_for "$d/events.jsonl" '"fault": "hang_in_save"' || bad "the stop's save did not start"
kill -TERM "$pid"
wait "$pid"
rc=$?
check "a second SIGTERM during the stop's save: killed at once by the signal (rc $rc = 143)" "[ $rc = 143 ]"
check "... no 'interrupted' event for it, a partial save left behind" \
  "[ \$(grep -c '\"interrupted\"' '$d/events.jsonl') = 1 ] && ls -A '$d/checkpoints' | grep -q '^\.tmp-step_'"
check "... the previous checkpoint is intact: LATEST step_$prev, it verifies" \
  "[ \"\$(cat '$d/checkpoints/LATEST')\" = step_$prev ] && '$STRATA' ckpt verify '$d/checkpoints/step_$prev' >/dev/null 2>&1"
if "$STRATA" resume "$d" train.steps=$((prev + 2)) >/dev/null 2>"$TMP/err"; then ok; else bad "resume after the aborted save exited $?: $(tail -2 "$TMP/err")"; fi
check "... and resume goes on from it, removing the partial save" \
  "grep -q 'resuming from .*step_$prev (step $prev)' '$TMP/err' && ! ls -A '$d/checkpoints' | grep -q '^\.tmp'"

# Under the supervisor: SIGTERM to `strata run` is forwarded once; the child
# saves and exits 8, which is no crash: no incident, no restart, exit 8.
"$STRATA" run "${LONG[@]}" recovery.backoff_s=0.05 run.dir="$TMP/sup-stop" >/dev/null 2>"$TMP/err" &
sup_pid=$!
wait_steps "$TMP/sup-stop" 5 || bad "the supervised run did not reach step 5"
kill -TERM "$sup_pid"
wait "$sup_pid"
rc=$?
n=$(last_step "$TMP/sup-stop")
check "SIGTERM to strata run: exit 8, interrupted, one attempt, no incident, checkpoint step_$n" \
  "[ $rc = 8 ] && $PY - '$TMP/sup-stop/recovery.json' <<'PYEOF' && [ \"\$(cat '$TMP/sup-stop/checkpoints/LATEST')\" = step_$n ]
import json, sys
r = json.load(open(sys.argv[1]))
assert r['outcome'] == 'interrupted' and r['exit_code'] == 8 and r['attempts'] == 1 and r['incidents_total'] == 0, r
PYEOF"
# SIGTERM sent to the child alone (a scheduler's preemption): not counted as a crash either.
"$STRATA" run "${LONG[@]}" recovery.backoff_s=0.05 run.dir="$TMP/sup-stop2" >/dev/null 2>"$TMP/err" &
sup_pid=$!
wait_steps "$TMP/sup-stop2" 5 || bad "the supervised run did not reach step 5"
child=$($PY -c 'import json,sys; print([e for e in map(json.loads, open(sys.argv[1])) if e["event"] == "child_start"][0]["pid"])' "$TMP/sup-stop2/events.jsonl")
kill -TERM "$child"
wait "$sup_pid"
rc=$?
check "SIGTERM to the child of strata run: exit 8, not restarted, not an incident" \
  "[ $rc = 8 ] && grep -q '\"outcome\": \"interrupted\"' '$TMP/sup-stop2/recovery.json' && grep -q '\"attempts\": 1,' '$TMP/sup-stop2/recovery.json' && grep -q '\"incidents_total\": 0,' '$TMP/sup-stop2/recovery.json' && grep -q child_interrupted '$TMP/sup-stop2/events.jsonl'"

finish test_ckpt.sh
