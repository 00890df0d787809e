#!/usr/bin/env bash
# test_identity.sh — one identity check for every command that runs a
# trained model (issue 24 item 3, docs/checkpoints.md "Identity"). One BPE
# run, stopped at step 3 by a NaN drill, gives checkpoints (eval, sample)
# and a NaN bundle (repro). For each of eval, sample and repro: a
# tokenizer override (data.tokenizer=byte), a swapped tokenizer.json, the
# block kind, rope theta and d_model each exit 7 naming the field with the
# recorded and the given value; --allow-mismatch lets a named field
# through and the output records it; evaluations with different overrides
# leave separate records; an older manifest without the block kind is read
# as llama and says so. Also sample's out-of-range BPE prompt id.
# Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-$PWD/.venv/bin/python}
DRILL="$PY $(realpath tests/e2e/ckpt_drill.py)"
TMP=$(mktemp -d /tmp/strata-e2e-identity-XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$TMP"' EXIT
# The cache of the whole make test when run_all.sh shares one (tests/README.md, "Time"); alone, a private one.
[ "${STRATA_E2E_SHARED_CACHE:-0}" = 1 ] || export STRATA_CACHE_DIR="$TMP/cache"
source "$(dirname "$0")/lib.sh"

F=/usr/share/games/fortunes
cat "$F/art" "$F/computers" >"$TMP/corpus.txt"
RUN=(configs/test.yml runtime.deterministic=true runtime.cpu_devices=1 run.progress=off data.synthetic=false
     data.path="$TMP/corpus.txt" data.tokenizer=bpe model.vocab_size=512 train.steps=3 train.eval_every=0 ckpt.every=1
     ckpt.async=false faults.nan_at=3:0)
R="$TMP/run"
expect_exit 5 'step 3: the first non-finite value' train "${RUN[@]}" run.dir="$R"
NB="$R/diag/nonfinite-step3"
check "the run has a checkpoint, a tokenizer.json and a NaN bundle with its tokenizer" \
  "[ -d '$R/checkpoints/step_2' ] && [ -s '$R/tokenizer.json' ] && cmp -s '$R/tokenizer.json' '$NB/tokenizer.json'"
H=$($PY -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest()[:16])' "$R/tokenizer.json")
check "the manifest records the whole model description (block kind included)" "$PY - '$R' '$NB' '$H' <<'PYEOF'
import json, sys
r, nb, h = sys.argv[1:]
m = json.load(open(r + '/checkpoints/step_2/manifest.json'))
assert m['tokenizer_hash'] == h, m['tokenizer_hash']
d = m['model']
assert d['block'] == 'llama' and d['n_kv_heads'] == 2 and d['layers'] == [] and d['rope_theta'] == 10000.0, d
assert set(d['kernels']) == {'rmsnorm', 'swiglu', 'cross_entropy', 'attention'}, d
n = json.load(open(nb + '/nonfinite.json'))
assert n['tokenizer_hash'] == h and n['model']['block'] == 'llama', n
c = json.load(open(r + '/context.json'))
assert c['model']['block'] == 'llama', c
PYEOF"

# A copy whose tokenizer.json is another file (the run's and the bundle's).
cp -r "$R" "$TMP/swapped"
for f in "$TMP/swapped/tokenizer.json" "$TMP/swapped/diag/nonfinite-step3/tokenizer.json"; do echo " " >>"$f"; done
H2=$($PY -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest()[:16])' "$TMP/swapped/tokenizer.json")

# --- every mismatch, on eval, sample and repro: exit 7 naming the field ----------------
mismatches() { # CMD TARGET SWAPPED_TARGET RECORDED_AS EXTRA...
  local cmd=$1 target=$2 swapped=$3 rec=$4
  shift 4
  expect_exit 7 "identity mismatch: tokenizer \"$H\" $rec, \"byte\" given" $cmd "$target" data.tokenizer=byte "$@"
  expect_exit 7 "identity mismatch: tokenizer \"$H\" $rec, \"$H2\" given" $cmd "$swapped" "$@"
  expect_exit 7 "identity mismatch: model.block \"llama\" $rec, \"parallel\" given" $cmd "$target" model.block=parallel "$@"
  expect_exit 7 "identity mismatch: model.rope_theta 10000.0 $rec, 500.0 given" $cmd "$target" model.rope_theta=500 "$@"
  expect_exit 7 "identity mismatch: model.d_model 32 $rec, 64 given" $cmd "$target" model.d_model=64 "$@"
  expect_exit 7 "model.rope_theta 10000.0 $rec, 500.0 given; model.block \"llama\" $rec, \"parallel\" given" \
    $cmd "$target" model.block=parallel model.rope_theta=500 "$@"
  expect_exit 2 "--allow-mismatch: 'model.rope_teta' names no identity field" $cmd "$target" --allow-mismatch=model.rope_teta "$@"
}
mismatches eval "$R" "$TMP/swapped" "in the checkpoint"
mismatches sample "$R" "$TMP/swapped" "in the checkpoint" --tokens 2
mismatches repro "$NB" "$TMP/swapped/diag/nonfinite-step3" "in nonfinite.json"
check "a refused eval wrote no record" "[ ! -d '$R/eval' ]"
expect_exit 7 "model.kernels.attention \"xla\" in the checkpoint, \"ffi\" given" eval "$R" kernels.attention=ffi

# --- what is allowed is recorded; evaluations with other overrides sit side by side ---
if "$STRATA" eval "$R" --json >"$TMP/e1.json" 2>"$TMP/err"; then ok; else bad "eval exited $?: $(tail -3 "$TMP/err")"; fi
if "$STRATA" eval "$R" train.eval_batches=2 --json >"$TMP/e2.json" 2>"$TMP/err"; then ok; else bad "eval eval_batches=2 exited $?: $(tail -3 "$TMP/err")"; fi
if "$STRATA" eval "$R" data.tokenizer=byte --allow-mismatch=tokenizer >"$TMP/e3.txt" 2>"$TMP/err"; then ok; else bad "eval allowed exited $?: $(tail -3 "$TMP/err")"; fi
check "allowed: the text says what was overridden, stderr the values" \
  "grep -q '^overridden:  tokenizer (--allow-mismatch)' '$TMP/e3.txt' && grep -q \"overridden (--allow-mismatch): tokenizer \\\"$H\\\" in the checkpoint, \\\"byte\\\" given\" '$TMP/err'"
check "three evaluations, three records; the overridden one says so, the others override nothing" "$PY - '$R' '$TMP' '$H' <<'PYEOF'
import glob, json, sys
r, t, h = sys.argv[1:]
recs = [json.load(open(p)) for p in sorted(glob.glob(r + '/eval/step_2-*.json'))]
assert len(recs) == 3, [p for p in glob.glob(r + '/eval/*')]
e1, e2 = json.load(open(t + '/e1.json')), json.load(open(t + '/e2.json'))
assert e1['identity']['overridden'] == [] and e1['overrides'] == [] and e2['overrides'] == ['train.eval_batches=2'], (e1, e2)
assert e1['config_hash'] != e2['config_hash'] and e1['token_file'] == e2['token_file'] and e2['eval_batches'] == 2
over = [x for x in recs if x['identity']['overridden']]
assert len(over) == 1 and over[0]['identity']['overridden'] == [{'field': 'tokenizer', 'recorded': h, 'given': 'byte'}], over
assert over[0]['overrides'] == ['data.tokenizer=byte'], over[0]
PYEOF"
expect_exit 0 '"field": "tokenizer"' repro "$NB" data.tokenizer=byte --allow-mismatch=tokenizer --json
expect_exit 0 '^reproduces: program block_fwd_res' repro "$NB"

# --- sample: an out-of-range BPE prompt id names the id and the vocabulary ------------
expect_exit 2 "--prompt '3 600': token id 600 is outside this run's vocabulary of 512 BPE tokens \\(ids 0..511\\)" \
  sample "$R" --prompt "3 600"

# --- an older manifest (no block, no kernels, no optimizer): read as llama, xla and adamw everywhere, and said so
cp -r "$R" "$TMP/old"
(cd "$TMP/old/checkpoints/step_2" && $DRILL fixmanifest . model "$($PY -c '
import json, sys
m = json.load(open("manifest.json"))["model"]
for k in ("block", "n_kv_heads", "layers", "n_experts", "moe_top_k", "moe_aux_weight", "moe_z_weight", "vocab_padded", "kernels",
          "optimizer"):
    m.pop(k)
print(json.dumps(m))')" >/dev/null)
expect_exit 0 'note: not recorded in the checkpoint \(an older format\), taken as: model.n_kv_heads 2, model.block "llama", .*model.kernels.attention "xla", model.optimizer.default "adamw", model.optimizer.groups \[\]; not recorded in the checkpoint \(an older format\), not compared: model.optimizer.momentum, model.optimizer.nesterov$' \
  sample "$TMP/old" --tokens 2 --prompt 3
expect_exit 7 'model.block not recorded in the checkpoint \(an older format: it meant "llama"\), "parallel" given' \
  eval "$TMP/old" model.block=parallel
# issue 29: another optimizer than the checkpoint's (recorded, or implied by an older one) is refused, naming both
expect_exit 7 'model.optimizer.default "adamw" in the checkpoint, "sgd" given' eval "$R" train.optimizer=sgd
expect_exit 7 'model.optimizer.default not recorded in the checkpoint \(an older format: it meant "adamw"\), "lion" given; model.optimizer.groups not recorded in the checkpoint \(an older format: it meant \[\]\), \["embed=sgd"\] given' \
  eval "$TMP/old" train.optimizer=lion "train.optimizer_groups=[embed=sgd]"
# strata ckpt inspect compares a run's checkpoint with the run's config.yaml by the same check.
expect_exit 0 'identity +.*identity mismatch: tokenizer "[0-9a-f]{16}" in the checkpoint, "[0-9a-f]{16}" given' ckpt inspect "$TMP/swapped/checkpoints/step_2"
expect_exit 0 'not recorded in the checkpoint \(an older format\), taken as: model.n_kv_heads 2, model.block "llama"' ckpt inspect "$TMP/old/checkpoints/step_2"

finish test_identity
