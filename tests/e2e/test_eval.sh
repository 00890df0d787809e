#!/usr/bin/env bash
# test_eval.sh — `strata eval` (issue 16 item 3): the loss of a finished
# run's parameters read back from disk equals the run's own final eval loss;
# another corpus gives another loss; bad input exits 2/3/7 naming the thing.
# Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d /tmp/strata-e2e-eval-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# The cache of the whole make test when run_all.sh shares one (tests/README.md, "Time"); alone, a private one.
[ "${STRATA_E2E_SHARED_CACHE:-0}" = 1 ] || export STRATA_CACHE_DIR="$TMP/cache"

source "$(dirname "$0")/lib.sh"

# Two small byte corpora: the run trains on a, b is another text.
$PY - "$TMP" <<'PYEOF'
import random, sys
r = random.Random(1)
words = ['the', 'cat', 'sat', 'on', 'a', 'mat', 'and', 'dog', 'ran']
open(sys.argv[1] + '/a.txt', 'w').write(' '.join(r.choice(words) for _ in range(4000)) + '\n')
open(sys.argv[1] + '/b.txt', 'w').write(''.join(r.choice('0123456789+-*/=()\n') for _ in range(20000)))
PYEOF
BASE=(configs/test.yml runtime.deterministic=true run.progress=off data.synthetic=false data.path="$TMP/a.txt" train.eval_batches=2)
if "$STRATA" train "${BASE[@]}" run.dir="$TMP/r1" >/dev/null 2>"$TMP/err"; then ok; else bad "train exited $?: $(tail -3 "$TMP/err")"; fi

# --- the run's own final eval loss, from its run directory and its checkpoint --
if "$STRATA" eval "$TMP/r1" >"$TMP/eval.txt" 2>"$TMP/err"; then ok; else bad "eval exited $?: $(tail -3 "$TMP/err")"; fi
check "eval prints loss, perplexity, bits per byte, tokens" \
  "grep -Eq '^loss: +[0-9.]+$' '$TMP/eval.txt' && grep -Eq '^perplexity: +[0-9.]+$' '$TMP/eval.txt' && grep -Eq '^bits/byte: +[0-9.]+$' '$TMP/eval.txt' && grep -Eq '^tokens: +128 ' '$TMP/eval.txt'"
check "eval names the newest checkpoint it loaded" "grep -q 'checkpoints/step_10/params.safetensors (step 10)' '$TMP/eval.txt'"
if "$STRATA" eval "$TMP/r1/checkpoints/step_10" --json >"$TMP/eval.json" 2>"$TMP/err"; then ok; else bad "eval --json exited $?: $(tail -3 "$TMP/err")"; fi
check "eval loss equals the run's final eval loss (metrics.jsonl, step 10) within 1e-6" "$PY - '$TMP' <<'PYEOF'
import json, math, sys, glob
d = sys.argv[1]
final = [json.loads(l) for l in open(d + '/r1/metrics.jsonl') if 'eval_loss' in l][-1]
assert final['step'] == 10, final
e = json.load(open(d + '/eval.json'))
assert e['step'] == 10 and e['tokens'] == 2 * 4 * 16 and e['split'] == 'validation', e
assert abs(e['loss'] - final['eval_loss']) <= 1e-6 * abs(final['eval_loss']), (e['loss'], final['eval_loss'])
assert abs(e['perplexity'] - math.exp(e['loss'])) < 1e-9 * e['perplexity']
assert abs(e['bits_per_byte'] - e['loss'] / math.log(2)) < 1e-12
text = open(d + '/eval.txt').read()
assert 'loss:        %.6f' % final['eval_loss'] in text, text
files = glob.glob(d + '/r1/eval/step_10-*.json')
assert len(files) == 1 and json.load(open(files[0]))['loss'] == e['loss'], files
PYEOF"

# --- another corpus: its validation split, another loss ----------------------
if "$STRATA" eval "$TMP/r1" data.path="$TMP/b.txt" --json >"$TMP/evalb.json" 2>"$TMP/err"; then ok; else bad "eval on b exited $?: $(tail -3 "$TMP/err")"; fi
check "another corpus gives another loss, written beside the first" "$PY - '$TMP' <<'PYEOF'
import json, sys, glob
d = sys.argv[1]
a, b = json.load(open(d + '/eval.json')), json.load(open(d + '/evalb.json'))
assert b['data_path'].endswith('/b.txt') and b['token_file'] != a['token_file'], b
assert abs(a['loss'] - b['loss']) > 1e-3, (a['loss'], b['loss'])
assert len(glob.glob(d + '/r1/eval/step_10-*.json')) == 2
PYEOF"
# Synthetic tokens are another tokenizer's ("none"): refused unless allowed, and then recorded.
expect_exit 7 'identity mismatch: tokenizer "byte" in the checkpoint, "none" given' eval "$TMP/r1" data.synthetic=true
if "$STRATA" eval "$TMP/r1" data.synthetic=true --allow-mismatch=tokenizer --json >"$TMP/evals.json" 2>"$TMP/err"; then ok; else bad "eval synthetic exited $?: $(tail -3 "$TMP/err")"; fi
check "synthetic data: bits per byte is null, the tokenizer override recorded" \
  "$PY -c 'import json,sys; j = json.load(open(sys.argv[1])); assert j[\"bits_per_byte\"] is None and j[\"identity\"][\"overridden\"][0][\"field\"] == \"tokenizer\"' '$TMP/evals.json'"

# --- memory and mesh policies do not change the loss -------------------------------
if "$STRATA" eval "$TMP/r1" sched.offload=params --json >"$TMP/evalo.json" 2>"$TMP/err"; then ok; else bad "eval offload exited $?: $(tail -3 "$TMP/err")"; fi
check "sched.offload=params: the same loss (parameters load into device slots)" \
  "$PY -c 'import json,sys; a, b = (json.load(open(p))[\"loss\"] for p in sys.argv[1:]); assert a == b, (a, b)' '$TMP/eval.json' '$TMP/evalo.json'"
# A data-parallel run: its checkpoint holds whole tensors, evaluated on one device.
if "$STRATA" train configs/test.yml runtime.deterministic=true run.progress=off parallel.data=2 run.dir="$TMP/dp" >/dev/null 2>"$TMP/err"; then ok; else bad "train dp exited $?: $(tail -3 "$TMP/err")"; fi
if "$STRATA" eval "$TMP/dp" --json >"$TMP/evaldp.json" 2>"$TMP/err"; then ok; else bad "eval dp exited $?: $(tail -3 "$TMP/err")"; fi
check "a parallel.data=2 run evaluates on one device to its own final eval loss (1e-6)" "$PY - '$TMP' <<'PYEOF'
import json, sys
d = sys.argv[1]
final = [json.loads(l) for l in open(d + '/dp/metrics.jsonl') if 'eval_loss' in l][-1]
e = json.load(open(d + '/evaldp.json'))
assert e['step'] == final['step'] == 10 and e['bits_per_byte'] is None, (e, final)
assert abs(e['loss'] - final['eval_loss']) <= 1e-6 * abs(final['eval_loss']), (e['loss'], final['eval_loss'])
PYEOF"

# --- bad input ------------------------------------------------------------------
expect_exit 2 "'$TMP/nope'.*expected a run directory or a checkpoint folder" eval "$TMP/nope"
mkdir -p "$TMP/plain"
expect_exit 2 "neither a run directory \(no config.yaml\) nor a checkpoint folder" eval "$TMP/plain"
expect_exit 2 "train.eval_batches" eval "$TMP/r1" train.eval_batches=0
expect_exit 2 "no_such" eval "$TMP/r1" model.no_such=1
expect_exit 2 "parallel.data" eval "$TMP/r1" parallel.data=2
expect_exit 3 "/nonexistent/corpus" eval "$TMP/r1" data.path=/nonexistent/corpus
expect_exit 2 "usage: strata eval" eval
# A damaged checkpoint named by itself is refused; the run falls back past it.
cp -r "$TMP/r1/checkpoints/step_10" "$TMP/r1/checkpoints/step_11"
$PY - "$TMP/r1/checkpoints/step_11/params.safetensors" <<'PYEOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read()); b[-10] ^= 1; open(p, 'wb').write(b)
PYEOF
expect_exit 7 "step_11.*params.safetensors" eval "$TMP/r1/checkpoints/step_11"
expect_exit 0 "checkpoints/step_10/params.safetensors \(step 10\)" eval "$TMP/r1"

finish test_eval
