#!/usr/bin/env bash
# run_all.sh — runs every tests/e2e/test_*.sh from the repository root (each
# exits 0 when all its checks pass), then prints "N passed, M failed" and
# exits non-zero if any script failed. Scripts find the binary as
# ${STRATA:-./build/strata}.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

passed=0
failed=0
failed_names=()
for t in tests/e2e/test_*.sh; do
  [ -e "$t" ] || continue # no scripts: the glob stays literal
  echo "== $t"
  start=$SECONDS
  if bash "$t"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failed_names+=("$t")
  fi
  echo "   ($t: $((SECONDS - start)) s)"
done
for name in "${failed_names[@]+"${failed_names[@]}"}"; do echo "FAILED: $name"; done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
