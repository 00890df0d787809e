#!/usr/bin/env bash
# make_corpus.sh DIR — seeds the fuzz corpus in DIR: every configs/*.yml as
# is, some with overrides appended (the target reads NUL-separated overrides
# after the YAML), a few small edge cases; and writes DIR.dict, a libFuzzer
# dictionary of the schema's key names and YAML punctuation. Existing corpus
# entries (what earlier runs found) are kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: make_corpus.sh DIR}
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

# Dictionary: every key component in base.yml, plus YAML syntax.
{
  grep -oE '^ *[a-z_][a-z_0-9]*:' configs/base.yml | tr -d ' :' | sort -u | sed 's/.*/"&"/'
  for t in ':' ': ' '- ' '[' ']' '{' '}' ',' '.' '=' '"' "'" '#' '&' '*' '!' '|' '>' '~' '---' '...' \
    'true' 'false' 'null' 'base_config' '1e-8' '0.5' '-1' '\n  '; do
    printf '"%s"\n' "$(printf '%s' "$t" | sed 's/\\/\\\\/g; s/"/\\"/g')"
  done
} >"$dir.dict"
