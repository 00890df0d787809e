#!/usr/bin/env bash
# test_sample.sh — `strata sample` end to end (docs/using.md, "strata
# sample"): the run directory and checkpoint-folder forms, seeds, every bad
# flag (exit 2 naming it), a named checkpoint that does not verify (exit 7), a
# synthetic-data run (token ids), a data-parallel run sampled on one device.
# The KV-cache-against-full-recompute equivalence is tests/py/test_sample.py;
# the sample at the end of `strata train` is checked in test_train.sh. Run
# from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d /tmp/strata-e2e-sample-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

source "$(dirname "$0")/lib.sh"

BYTES=(configs/test.yml runtime.deterministic=true run.progress=off data.synthetic=false data.path=/usr/share/games/fortunes
       train.steps=3 train.eval_every=0 ckpt.every=2)
if "$STRATA" train "${BYTES[@]}" run.dir="$TMP/run" >"$TMP/out" 2>"$TMP/err"; then ok; else bad "train: $(tail -3 "$TMP/err")"; fi
check "the run has two checkpoints (step_2, step_3) and params.safetensors" \
  "[ -d '$TMP/run/checkpoints/step_2' ] && [ -d '$TMP/run/checkpoints/step_3' ] && [ -f '$TMP/run/params.safetensors' ]"

# --- RUN_DIR, CHECKPOINT_DIR, seeds ---------------------------------------------------
"$STRATA" sample "$TMP/run" --prompt "Hello" --tokens 20 --seed 4 >"$TMP/a" 2>"$TMP/err"
check "sample RUN_DIR: exit 0, the prompt then 20 bytes on stdout" \
  "[ \$? = 0 ] && [ \$(head -c 5 '$TMP/a') = Hello ] && [ \$(stat -c %s '$TMP/a') = 25 ]"
"$STRATA" sample "$TMP/run" --prompt "Hello" --tokens 20 --seed 4 >"$TMP/b" 2>/dev/null
"$STRATA" sample "$TMP/run" --prompt "Hello" --tokens 20 --seed 5 >"$TMP/c" 2>/dev/null
check "the same --seed repeats the text exactly" "cmp -s '$TMP/a' '$TMP/b'"
check "another --seed gives other text" "! cmp -s '$TMP/a' '$TMP/c'"
"$STRATA" sample "$TMP/run/checkpoints/step_3" --prompt "Hello" --tokens 20 --seed 4 >"$TMP/d" 2>/dev/null
check "the newest checkpoint folder gives what the run directory gives (its newest checkpoint)" "cmp -s '$TMP/a' '$TMP/d'"
"$STRATA" sample "$TMP/run/checkpoints/step_2" --prompt "Hello" --tokens 20 --temperature 1 --seed 1 >"$TMP/e" 2>/dev/null
"$STRATA" sample "$TMP/run/checkpoints/step_3" --prompt "Hello" --tokens 20 --temperature 1 --seed 1 >"$TMP/f" 2>/dev/null
check "an older checkpoint folder is a model of its own (step_2 and step_3 draw other text with one seed)" \
  "[ -s '$TMP/e' ] && ! cmp -s '$TMP/e' '$TMP/f'"
"$STRATA" sample "$TMP/run" --prompt=Hello --tokens=20 --seed=4 >"$TMP/g" 2>/dev/null
check "--flag=VALUE is --flag VALUE" "cmp -s '$TMP/a' '$TMP/g'"

# --- bad input: exit 2 naming the flag or path ----------------------------------------
expect_exit 2 "--tokens '0': give a whole number of tokens from 1 to 1000000" sample "$TMP/run" --tokens 0
expect_exit 2 "--tokens 'ten'" sample "$TMP/run" --tokens ten
expect_exit 2 "--tokens '1000001'" sample "$TMP/run" --tokens 1000001
expect_exit 2 "--temperature '-1': give a number >= 0" sample "$TMP/run" --temperature -1
expect_exit 2 "--temperature 'nan'" sample "$TMP/run" --temperature nan
expect_exit 2 "--top-k '-1': give a whole number >= 0" sample "$TMP/run" --top-k -1
expect_exit 2 "--top-p '0': give a probability in \\(0, 1\\]" sample "$TMP/run" --top-p 0
expect_exit 2 "--top-p '1.5'" sample "$TMP/run" --top-p 1.5
expect_exit 2 "--seed '-3'" sample "$TMP/run" --seed -3
expect_exit 2 "unknown flag '--temp'; the flags are --prompt, --tokens" sample "$TMP/run" --temp 1
expect_exit 2 "--tokens needs a value" sample "$TMP/run" --tokens
expect_exit 2 "--prompt is empty" sample "$TMP/run" --prompt ""
expect_exit 2 "needs a run directory or a checkpoint folder" sample
expect_exit 2 "'$TMP/nope': No such file or directory \\(expected a run directory or a checkpoint folder\\)" sample "$TMP/nope"
expect_exit 2 "'$TMP' is neither a run directory \\(no config.yaml\\) nor a checkpoint folder" sample "$TMP"
mkdir -p "$TMP/fresh" && cp "$TMP/run/config.yaml" "$TMP/fresh/"
expect_exit 2 "run directory '$TMP/fresh' has no parameters to load" sample "$TMP/fresh"

# --- checkpoints that do not verify: exit 7 -------------------------------------------
cp -r "$TMP/run" "$TMP/bad"
$PY - "$TMP/bad/checkpoints" <<'PYEOF'
import os, sys
for step in ("step_2", "step_3"):  # flip one byte of each checkpoint's parameters
    p = os.path.join(sys.argv[1], step, "params.safetensors")
    b = bytearray(open(p, "rb").read()); b[-5] ^= 0x40; open(p, "wb").write(bytes(b))
PYEOF
expect_exit 7 "checkpoint error: .*step_3/params.safetensors: tensor '[a-z_.0-9]+': checksum mismatch" sample "$TMP/bad/checkpoints/step_3"
"$STRATA" sample "$TMP/bad" --tokens 5 >"$TMP/out" 2>"$TMP/err"
check "a run whose checkpoints all fail verification falls back to its params.safetensors (exit 0)" \
  "[ \$? = 0 ] && [ \$(stat -c %s '$TMP/out') = 6 ]"
rm "$TMP/bad/params.safetensors"
expect_exit 7 "has no parameters to load: no valid checkpoint under checkpoints/ \\(every one failed verification" sample "$TMP/bad"

cp -r "$TMP/run" "$TMP/other" && sed -i 's/^  d_model: 32$/  d_model: 64/' "$TMP/other/config.yaml"
expect_exit 7 "other/checkpoints/step_3/manifest.json': identity mismatch: model.d_model 32 in the checkpoint, 64 given" sample "$TMP/other"

# --- synthetic data: token ids --------------------------------------------------------
if "$STRATA" train configs/test.yml runtime.deterministic=true run.progress=off train.steps=2 run.dir="$TMP/syn" >/dev/null 2>"$TMP/err"; then ok; else bad "train synthetic: $(tail -3 "$TMP/err")"; fi
"$STRATA" sample "$TMP/syn" --prompt "3 14 15" --tokens 6 >"$TMP/out" 2>"$TMP/err"
check "synthetic data: the prompt ids then 6 ids on one line, a note on stderr" \
  "[ \$? = 0 ] && grep -Eq '^3 14 15( [0-9]+){6}\$' '$TMP/out' && grep -q 'synthetic data' '$TMP/err'"
expect_exit 2 "this run has synthetic data \\(no text\\), so a prompt is token ids" sample "$TMP/syn" --prompt "abc"
expect_exit 2 "--prompt .256.: token id 256 is outside this run.s vocabulary of 256 tokens \\(ids 0..255\\)" sample "$TMP/syn" --prompt "256"

# --- a data-parallel run is sampled on one device -------------------------------------
if "$STRATA" train "${BYTES[@]}" parallel.data=2 run.dir="$TMP/dp" >/dev/null 2>"$TMP/err"; then ok; else bad "train data=2: $(tail -3 "$TMP/err")"; fi
mkdir -p "$TMP/cwd"
(cd "$TMP/cwd" && "$STRATA" sample "$TMP/dp" --prompt "Hi" --tokens 10 >"$TMP/out" 2>"$TMP/err")
check "sample of a parallel.data=2 run: exit 0, 12 bytes" "[ \$? = 0 ] && [ \$(stat -c %s '$TMP/out') = 12 ]"
check "... with the one-device bundle from the cache, nothing written where it ran" "[ -z \"\$(ls -A '$TMP/cwd')\" ]"

finish test_sample.sh
