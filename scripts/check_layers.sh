#!/usr/bin/env bash
# check_layers.sh — the modules' one-way dependency order
# (docs/architecture.md, "Modules"): a file of module M (src/M/*, or M's
# public header include/strata/M.h) may include the headers of M and of the
# modules before M, never of a module after it, and never another module's
# private headers (src/<other>/*.h). And only config itself and the typed
# options (src/plan/options.c) look config keys up by name. Run by ctest
# (check_layers) and `make test`; exits 1 naming every violation.
#
#   scripts/check_layers.sh [ROOT]     ROOT defaults to the repository
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}

# The order, lowest first. A module may use the ones before it.
ORDER=(base ir config data bundle ckpt obs runtime dist kernels sched diag plan infer train cli)
# Public headers that belong to a module of another name.
declare -A OWNER=([status]=base [tensor]=base [mesh]=runtime)

declare -A RANK
for i in "${!ORDER[@]}"; do RANK[${ORDER[$i]}]=$i; done

bad=0
complain() {
  echo "check_layers: $1" >&2
  bad=1
}

# module_of_header HEADER -> the module owning an included "strata/x.h" or
# "m/x.h"; prints nothing for system headers.
module_of_header() {
  case "$1" in
    strata/*.h)
      local n=${1#strata/}
      n=${n%.h}
      echo "${OWNER[$n]:-$n}"
      ;;
    */*.h) echo "${1%%/*}" ;;
  esac
}

# check FILE MODULE: every quoted include of FILE against MODULE's rank.
check() {
  local file=$1 mod=$2 line inc dep
  local rank=${RANK[$mod]:-}
  if [ -z "$rank" ]; then
    complain "${file#"$ROOT"/}: module '$mod' is not in the order (scripts/check_layers.sh ORDER)"
    return
  fi
  while IFS= read -r line; do
    inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/' <<<"$line")
    dep=$(module_of_header "$inc")
    [ -z "$dep" ] && continue
    if [ -z "${RANK[$dep]:-}" ]; then
      complain "${file#"$ROOT"/}: includes \"$inc\" of unknown module '$dep'"
    elif [ "${RANK[$dep]}" -gt "$rank" ]; then
      complain "${file#"$ROOT"/}: $mod includes \"$inc\" of $dep, which comes after $mod (${ORDER[*]})"
    elif [ "$dep" != "$mod" ] && [[ "$inc" != strata/* ]]; then
      complain "${file#"$ROOT"/}: $mod includes \"$inc\", a private header of $dep (use include/strata/$dep.h)"
    fi
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$file")
}

shopt -s nullglob
for dir in "$ROOT"/src/*/; do
  mod=$(basename "$dir")
  for f in "$dir"*.c "$dir"*.h; do check "$f" "$mod"; done
done
for h in "$ROOT"/include/strata/*.h; do
  n=$(basename "$h" .h)
  check "$h" "${OWNER[$n]:-$n}"
done

# The typed options (src/plan/options.c) are the one reader of config
# keys: nothing else looks a key up by name.
while IFS= read -r hit; do
  complain "$(cut -d: -f1,2 <<<"${hit#"$ROOT"/}"): reads a config key by name; take it from the typed options (st_plan_options)"
done < <(grep -nE 'st_config_(int|bool|float|string|list_count|list_item)[[:space:]]*\(' "$ROOT"/src/*/*.c "$ROOT"/src/*/*.h |
         grep -vE "^$ROOT/src/config/|^$ROOT/src/plan/options\.c:")

if [ "$bad" -ne 0 ]; then
  echo "check_layers: FAILED (the order is in docs/architecture.md, \"Modules\")" >&2
  exit 1
fi
echo "check_layers: ok (${ORDER[*]})"
