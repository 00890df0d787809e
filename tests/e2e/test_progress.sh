#!/usr/bin/env bash
# test_progress.sh — long operations show their progress (issue 16 item 8):
# export, compile, tokenizing and checkpoint writing draw "<what>: done/total"
# lines on stderr with run.progress=on (as on a terminal), none with
# run.progress=off (a pipe or a log), and checkpoint writing and tokenizing
# only from run.progress_min_bytes on. Also the end-of-run summary's share of
# the matmul peak when no `strata doctor` stored one: measured once, stored.
# Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d /tmp/strata-e2e-progress-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

source "$(dirname "$0")/lib.sh"

# A 30000-byte text corpus (29.3 KiB).
$PY -c "import sys; w = 'the quick brown fox jumps over the lazy dog '; sys.stdout.write((w * 700)[:30000])" >"$TMP/corpus.txt"
BASE=(configs/test.yml runtime.deterministic=true data.synthetic=false data.path="$TMP/corpus.txt" train.steps=4 train.eval_every=0)
# Every line drawn, one per redraw ('\r' starts a redraw).
lines() { tr '\r' '\n' <"$1" | grep -v '^$'; }

# --- off: a fresh cache (export, compile, tokenize all run), nothing drawn --------
if STRATA_CACHE_DIR="$TMP/c_off" "$STRATA" train "${BASE[@]}" run.progress=off run.progress_min_bytes=0 run.dir="$TMP/off" \
  >/dev/null 2>"$TMP/off.err"; then ok; else bad "train (off) exited $?: $(tail -3 "$TMP/off.err")"; fi
check "run.progress=off: the cache was cold (the bundle was exported)" "grep -q '\"exported\": true' '$TMP/off/events.jsonl'"
check "run.progress=off: no progress lines" \
  "! lines '$TMP/off.err' | grep -Eq '^(export|compile|tokenize|checkpoint step_[0-9]+): [0-9.]+/'"

# --- on, threshold 0: every long operation draws, and ends at its total ---------
if STRATA_CACHE_DIR="$TMP/c_on" "$STRATA" train "${BASE[@]}" run.progress=on run.progress_min_bytes=0 run.dir="$TMP/on" \
  >/dev/null 2>"$TMP/on.err"; then ok; else bad "train (on) exited $?: $(tail -3 "$TMP/on.err")"; fi
check "run.progress=on: export, compile, tokenize and checkpoint lines, each ending at its total" "$PY - '$TMP/on.err' '$TMP/on' <<'PYEOF'
import json, re, sys
err = open(sys.argv[1]).read().replace('\r', '\n')
def last(what):
    m = re.findall(r'^' + what + r': ([0-9.]+)/([0-9.]+) (\w+)$', err, re.M)
    assert m, (what, err[:2000])
    return m
ex = last('export')
assert ex[-1][0] == ex[-1][1] and ex[-1][2] == 'programs' and int(ex[-1][1]) >= 10, ex
import os
events = [json.loads(l) for l in open(sys.argv[2] + '/events.jsonl')]
bundle = [e for e in events if e['event'] == 'bundle'][0]
n_programs = len(json.load(open(os.path.join(bundle['dir'], 'manifest.json')))['programs'])
assert int(ex[-1][1]) == n_programs, (ex[-1], n_programs)
co = last('compile')
assert co[0][0] == '0' and co[-1][0] == co[-1][1] and co[-1][2] == 'programs', co
to = last('tokenize')
assert to[-1][0] == to[-1][1] and float(to[-1][1]) == round(30000 / 1024, 1) and to[-1][2] == 'KiB', to
ck = last('checkpoint step_4')
assert ck[-1][0] == ck[-1][1] and ck[-1][2] in ('KiB', 'MiB'), ck
# Redrawn at most once per percent, not once per write.
assert len(ck) <= 102 and len(to) <= 102, (len(ck), len(to))
PYEOF"

# --- on, default threshold (64 MiB): small checkpoints and corpora stay quiet ---
# The first run's cache without its bundle and tokens: an export and tokenizing again, compiles from the executable cache.
rm -rf "$TMP/c_off/bundles" "$TMP/c_off/tokens"
if STRATA_CACHE_DIR="$TMP/c_off" "$STRATA" train "${BASE[@]}" run.progress=on run.dir="$TMP/min" \
  >/dev/null 2>"$TMP/min.err"; then ok; else bad "train (min) exited $?: $(tail -3 "$TMP/min.err")"; fi
check "run.progress_min_bytes: no tokenize or checkpoint line below it; export and compile still drawn" \
  "lines '$TMP/min.err' | grep -Eq '^export: [0-9]+/[0-9]+ programs$' && lines '$TMP/min.err' | grep -Eq '^compile: [0-9]+/[0-9]+ programs$' && ! lines '$TMP/min.err' | grep -Eq '^(tokenize|checkpoint step_4): '"

# --- strata data: tokenizing a corpus --------------------------------------------
if STRATA_CACHE_DIR="$TMP/c_data" "$STRATA" data "${BASE[@]}" run.progress=on run.progress_min_bytes=1000 \
  >/dev/null 2>"$TMP/data.err"; then ok; else bad "strata data exited $?: $(tail -3 "$TMP/data.err")"; fi
check "strata data draws the tokenize line" "lines '$TMP/data.err' | grep -Eq '^tokenize: 29.3/29.3 KiB$'"
expect_exit 2 "run.progress_min_bytes" data "${BASE[@]}" run.progress_min_bytes=-1

# --- the summary's matmul peak without strata doctor: measured once, stored ------
check "summary without a stored peak: measured by this run and stored (by: train)" "$PY - '$TMP/on.err' '$TMP/c_on' <<'PYEOF'
import glob, json, re, sys
err = open(sys.argv[1]).read()
f = re.search(r'^  ([0-9.e+-]+) GFLOP/s of model FLOPs = ([0-9.e+-]+)% of the measured matmul peak \(([0-9.e+-]+) GFLOP/s, strata train\)$', err, re.M)
assert f, err[-2000:]
stored = [json.load(open(p)) for p in glob.glob(sys.argv[2] + '/matmul_peak/*.json')]
assert len(stored) == 1 and stored[0]['by'] == 'train', stored
assert abs(float(f.group(3)) - stored[0]['best_gflops']) <= 1e-3 * stored[0]['best_gflops'], (f.groups(), stored)
PYEOF"
# A second run reads it back instead of measuring (the file is not rewritten).
before=$(stat -c %Y.%s "$TMP"/c_on/matmul_peak/*.json)
sleep 1
if STRATA_CACHE_DIR="$TMP/c_on" "$STRATA" train "${BASE[@]}" run.progress=on run.dir="$TMP/on2" >/dev/null 2>"$TMP/on2.err"; then ok; else bad "second train exited $?"; fi
check "the next summary reuses the stored peak" \
  "grep -q 'measured matmul peak (.*, strata train)' '$TMP/on2.err' && [ \"\$(stat -c %Y.%s \"$TMP\"/c_on/matmul_peak/*.json)\" = '$before' ]"

finish test_progress
