#!/usr/bin/env bash
# check_functions.sh — every function in src/ is at most 150 lines (issue
# 25: a function longer than that is split at its phases, each a static
# function whose comment says why it is one). Run by ctest
# (check_functions) and `make test`; exits 1 naming file, function and
# length of each one over the limit.
#
#   scripts/check_functions.sh [ROOT] [LIMIT]   ROOT defaults to the repository, LIMIT to 150
#
# The house style makes a brace count unnecessary: a function definition
# starts at column 0 with its name and "(" (its parameters may wrap onto
# indented lines up to the "{"), and its body ends with a "}" alone at
# column 0. Anything else at column 0 that ends in "{" (a struct, an
# initializer) closes with "};" or "} name;", never a lone "}". The length
# counted is from the definition's first line to its closing "}".
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
LIMIT=${2:-150}

files=$(find "$ROOT/src" -type f \( -name '*.c' -o -name '*.h' \) | LC_ALL=C sort)
[ -n "$files" ] || { echo "check_functions: no sources under $ROOT/src" >&2; exit 1; }

# shellcheck disable=SC2086
awk -v limit="$LIMIT" -v root="$ROOT/" '
  FNR == 1 { cand = 0; inside = 0 }
  # A definition: an identifier at column 0 followed somewhere by "(";
  # not a preprocessor line, a comment, or a declaration ending in ";".
  !inside && /^[A-Za-z_][A-Za-z0-9_ \t*,]*\(/ && !/^(typedef|struct|enum|union)[ \t]/ {
    cand = FNR
    head = $0
    sub(/\(.*/, "", head)
    n = split(head, w, /[ \t*]+/)
    name = w[n]
  }
  !inside && cand && /;[ \t]*$/ && !/\{[ \t]*$/ { cand = 0 }
  !inside && cand && /\{[ \t]*$/ { inside = 1; start = cand; cand = 0; next }
  inside && /^}[ \t]*$/ {
    inside = 0
    len = FNR - start + 1
    if (len > limit) {
      f = FILENAME
      sub("^" root, "", f)
      printf "check_functions: %s:%d: %s is %d lines (at most %d: split it at its phases)\n", f, start, name, len, limit > "/dev/stderr"
      bad = 1
    }
  }
  END { exit bad }
' $files
