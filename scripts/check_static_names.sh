#!/usr/bin/env bash
# check_static_names.sh — every file-private function of src/ (st__*) has a
# name no other file defines (issue 25, item 8; SQLite's habit): a name says
# where it lives, so a grep, a backtrace or a profile finds one function.
# Checks functions defined at column 0, static or module-private. Run by
# ctest (check_static_names); exits 1 naming every duplicate.
#
#   scripts/check_static_names.sh [ROOT]     ROOT defaults to the repository
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}

# Duplicates tolerated (none: every name is unique; a name added here
# must say why).
KNOWN=" "

cd "$ROOT" || exit 2
dups=$(grep -rHoE --include='*.c' '^(static[[:space:]]+)?(inline[[:space:]]+)?(const[[:space:]]+)?[A-Za-z_][A-Za-z0-9_]*[[:space:]*]+st__[A-Za-z0-9_]+\(' src |
  sed -E 's/^([^:]+):.*[[:space:]*](st__[A-Za-z0-9_]+)\($/\2 \1/' | sort -u |
  awk '{files[$1] = files[$1] " " $2; n[$1]++} END {for (k in n) if (n[k] > 1) print k ":" files[k]}' | sort)
bad=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  name=${line%%:*}
  case "$KNOWN" in *" $name "*) continue ;; esac
  echo "check_static_names: $name is defined in more than one file:${line#*:}" >&2
  bad=1
done <<< "$dups"
exit $bad
