#!/usr/bin/env bash
# run_all.sh — runs every tests/e2e/test_*.sh from the repository root (each
# exits 0 when all its checks pass), then prints "N passed, M failed" and
# exits non-zero if any script failed. Scripts find the binary as
# ${STRATA:-./build/strata}.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# One bundle and executable cache for every script that does not test the
# cache itself: the one pytest uses (STRATA_CACHE_DIR, else ~/.cache/strata),
# so a config exported and compiled once is loaded everywhere after. The
# scripts testing a cold export, concurrent exports, damaged or tampered
# entries or the cache's path (test_train, test_progress, test_json,
# test_config, test_install, test_ckpt's cold-export drill) keep private
# ones. Entries are locked per bundle and renamed into place, so the two
# streams of make test share it safely. STRATA_E2E_SHARED_CACHE=0: every
# script its own empty cache, as when run alone.
export STRATA_E2E_SHARED_CACHE=${STRATA_E2E_SHARED_CACHE:-1}

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
