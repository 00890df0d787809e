#!/usr/bin/env bash
# make_corpus.sh OUT — seeds the fuzz corpora: OUT/<target>/ for every
# target of run.sh, and OUT/<target>.dict, a libFuzzer dictionary.
#   config: every configs/*.yml as is, some with overrides appended (the
#     target reads NUL-separated overrides after the YAML), a few small edge
#     cases; the dictionary holds the schema's key names and YAML syntax.
#   the others: the committed seeds in tests/fuzz/corpus/<target>/ (real
#     files strata writes or reads, edge cases, and every input a fuzzer
#     found a bug with: a regression seed).
# Existing corpus entries (what earlier runs found) are kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: make_corpus.sh OUT}
mkdir -p "$out"

# --- config -------------------------------------------------------------
dir="$out/config"
mkdir -p "$dir"
for f in configs/*.yml; do
  name=$(basename "$f" .yml)
  cp "$f" "$dir/seed-$name.yml"
  { cat "$f"; printf '\0train.steps=7\0model.n_layers=3\0runtime.xla_options=[a=1, "b, c"]'; } >"$dir/seed-$name-overrides"
done
printf 'train: {steps: 5, lr: 1e-3}\nmodel.d_model: 64\n' >"$dir/seed-flow"
printf 'data:\n  path: "a\\tb \\u00e9"\nrun:\n  id: '"'"'x y'"'"'\n' >"$dir/seed-strings"
printf 'runtime:\n  xla_options:\n    - a=1\n    - ""\n' >"$dir/seed-list"
printf '\0run.id=on\0data.synthetic=true\0model.vocab_size=100' >"$dir/seed-only-overrides"

dict_line() { printf '"%s"\n' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')"; }

{
  grep -oE '^ *[a-z_][a-z_0-9]*:' configs/base.yml | tr -d ' :' | sort -u | sed 's/.*/"&"/'
  for t in ':' ': ' '- ' '[' ']' '{' '}' ',' '.' '=' '"' "'" '#' '&' '*' '!' '|' '>' '~' '---' '...' \
    'true' 'false' 'null' 'base_config' '1e-8' '0.5' '-1' '\n  '; do
    dict_line "$t"
  done
} >"$out/config.dict"

# --- committed seeds ------------------------------------------------------
for t in safetensors ckpt_manifest bundle tokens tokenizer json mlir_sig ir config report diff compare; do
  mkdir -p "$out/$t"
  if [ -d "tests/fuzz/corpus/$t" ]; then cp tests/fuzz/corpus/"$t"/* "$out/$t/"; fi
done

# --- dictionaries -----------------------------------------------------------
json_syntax=('{' '}' '[' ']' ':' ',' '"' '\' '\u0000' '\ud83d\ude00' 'true' 'false' 'null' '0' '-0' '1.5' '1e400' '18446744073709551615' '9007199254740993')
{
  for t in "${json_syntax[@]}" '"dtype"' '"shape"' '"data_offsets"' '"__metadata__"' '"F32"' '"BF16"' '"U8"' '"I64"' '"BOOL"' '"C64"' '"F8_E4M3"'; do dict_line "$t"; done
} >"$out/safetensors.dict"
{
  for t in "${json_syntax[@]}" '"format"' '"strata-checkpoint"' '"version"' '"step"' '"optimizer_step"' '"data"' '"position"' \
    '"batch_size"' '"rng"' '"seed"' '"lr_schedule"' '"lr"' '"total_steps"' '"config_hash"' '"bundle_key"' '"model"' '"config"' \
    '"files"' '"tensors"' '"file"' '"bytes"' '"xxh64"' '"name"' '"dtype"' '"shape"' '"offset"' '"manifest_xxh64"' '"0000000000000000"'; do
    dict_line "$t"
  done
} >"$out/ckpt_manifest.dict"
{
  for t in "${json_syntax[@]}" '"schema_version"' '"bundle_key"' '"versions"' '"jax"' '"model"' '"vocab_size"' '"d_model"' \
    '"n_layers"' '"n_heads"' '"d_ff"' '"seq_len"' '"microbatch_size"' '"tie_embeddings"' '"compute_dtype"' '"programs"' '"name"' \
    '"file"' '"sha256"' '"inputs"' '"outputs"' '"donated"' '"flops"' '"groups"' '"params"' '"group"' '"local"' '"layer"' \
    '"decay"' '"dtype"' '"shape"' '"role"' '"f32"' '"bf16"' '"s32"' '"kernels"' '"ops"' '"impl"' '"version"' \
    '"targets"' '"fallback"'; do
    dict_line "$t"
  done
} >"$out/bundle.dict"
{ for t in "${json_syntax[@]}" '"k"' '\n' '\t' '1e-999'; do dict_line "$t"; done; } >"$out/json.dict"
{
  for t in "${json_syntax[@]}" '"format"' '"strata-dump/1"' '"step"' '"entries"' '"tensors"' '"model"' '"n_layers"' \
    '"d_model"' '"d_ff"' '"seq_len"' '"vocab_size"' '"microbatch_rows"' '"compute_dtype"' '"program"' '"phase"' '"stage"' \
    '"layer"' '"micro"' '"op"' '"io"' '"in"' '"out"' '"name"' '"class"' '"dtype"' '"shape"' '"key"' '"f32"' '"bf16"' '"s32"' \
    '"fwd"' '"recompute"' '"accum"' '"update"' '"param"' '"param_updated"' '"gradient"' '"lr"' '"gscale"' '"hyper"' \
    '"v_wte"' '"grad_wte"' '"wte"' '"k"' '"b"'; do
    dict_line "$t"
  done
} >"$out/compare.dict"
{
  for t in "${json_syntax[@]}" '\n' '"step"' '"loss"' '"eval_loss"' '"lr"' '"grad_norm"' '"tokens"' '"step_time_s"' \
    '"tokens_per_s"' '"wait_s"' '"recompute_s"' '"transfer_s"' '"peak_live_bytes"' '"peak_live_bytes_predicted"' \
    '"peak_live_by_category"' '"params"' '"time"' '"event"' '"error"' '"context"' 'NaN' '<' '&' '\xff'; do
    dict_line "$t"
  done
} >"$out/report.dict"
{
  for t in "${json_syntax[@]}" '\n' '"step"' '"loss"' '"eval_loss"' '"lr"' '"grad_norm"' '"tokens_per_s"' '"step_time_s"' \
    '"entries"' '"kind"' '"hypothesis"' '"conclusion"' '"note"' '"author"' '"text"' '"time"' '"schema"' '"run_id"' '"peak"' \
    '"flops"' '<' '&' '\xff'; do
    dict_line "$t"
  done
} >"$out/diff.dict"
{
  for t in 'func.func public @main(' 'func.func @main(' '%arg0: ' 'tensor<' '>' 'x' 'xf32' 'xbf16' 'xi32' 'xi1' 'xui32' '?x' \
    ' -> ' '(' ')' '{' '}' ', ' 'tf.aliasing_output = 0 : i32' 'jax.buffer_donor = true' 'jax.result_info = "result[0]"' \
    '#encoding' '"'; do
    dict_line "$t"
  done
  printf '"ML\\xefR"\n'
} >"$out/mlir_sig.dict"
{
  for t in 'func.func public @main(' 'func.func private @f(' 'call @f(' '%0 = ' '%0:2 = ' '%0#1' 'tensor<' 'x?x' 'xf32>' 'xf64>' \
    'stablehlo.dot_general ' 'contracting_dims = [1] x [0]' 'batching_dims = [0] x [0]' 'stablehlo.reduce(' ' init: ' \
    'applies stablehlo.add across dimensions = [0]' 'stablehlo.while(%iterArg = %c' 'cond {' '} do {' 'stablehlo.return ' \
    'stablehlo.compare  LT, ' 'stablehlo.constant dense<' '"stablehlo.all_reduce"(' '({' '})' '^bb0(' 'axis_ref<name = "data">' \
    'replica_groups = dense<[[0, 1]]>' 'stablehlo.custom_call @' 'xla_python_cpu_callback' '"stablehlo.case"(' \
    'sdy.manual_computation(' ' : (' ') -> ' '\n' '  }'; do
    dict_line "$t"
  done
} >"$out/ir.dict"
{ dict_line 'STRATOK1'; for t in '\x01\x00\x00\x00' '\x02\x00\x00\x00' '\x03\x00\x00\x00' '\x04\x00\x00\x00' '\x00\x01\x00\x00' '\xff\xff\xff\xff'; do printf '"%s"\n' "$t"; done; } >"$out/tokens.dict"
