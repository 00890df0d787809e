#!/usr/bin/env bash
# test_memory.sh — out of memory, predicted and real (issue 24, item 4;
# docs/scheduling.md "Will it fit", docs/architecture.md "Out of memory"):
#   1. a model predicted far above this host's memory (1.1 TB) is refused
#      on the CPU plugin with no runtime.device_memory_bytes: exit 4, the
#      host's memory named, a fit and a failed event (class "memory"),
#      before the init programs or any large allocation (peak RSS < 1 GB);
#      strata plan --fit says the same; strata run does not restart it
#   2. an explicit runtime.device_memory_bytes wins over the host's memory
#   3. a real allocation failure (ulimit -v, the check passed because
#      runtime.device_memory_bytes says 2 TB): exit 4, no abort, a failed
#      event with class "memory"; strata run does not restart it
#   4. a small run fits the host's memory (fit event, limit_scope host),
#      also on two devices (both devices' buffers counted)
# Every big run is under `ulimit -v` (virtual memory, 4 GB): without the
# check it would fill the host before the kernel's OOM killer ends it
# (or another process); with the limit it fails fast instead.
# Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=$(realpath "${PY:-.venv/bin/python}")
TMP=$(mktemp -d /tmp/strata-e2e-memory-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# The cache of the whole make test when run_all.sh shares one (tests/README.md, "Time"); alone, a private one.
[ "${STRATA_E2E_SHARED_CACHE:-0}" = 1 ] || export STRATA_CACHE_DIR="$TMP/cache"
source "$(dirname "$0")/lib.sh"

BASE=(configs/test.yml run.progress=off)
# The 1.1 TB plan of the report (issue 24): 64 layers of d_model 8192, d_ff 32768.
BIG=(model.d_model=8192 model.n_heads=64 model.n_layers=64 model.d_ff=32768)
VLIMIT_KB=4000000
ev() { grep -h "\"event\": \"$2\"" "$1/events.jsonl"; }

# peak_rss_run OUT_FILE CMD...: runs CMD under ulimit -v, writes the exit
# code and the largest resident set (bytes) of it and its children.
peak_rss_run() {
  local out=$1
  shift
  (ulimit -v $VLIMIT_KB && "$PY" -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[1] + ".err", "w"))
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
' "$out" "$@" >"$out")
}

# --- 1. refused before anything large --------------------------------------------
peak_rss_run "$TMP/big.rc" "$STRATA" train "${BASE[@]}" "${BIG[@]}" run.dir="$TMP/big"
read -r rc rss <"$TMP/big.rc"
check "1.1 TB on the CPU plugin: exit 4 naming the host's memory and the advice (exit $rc: $(tail -c 300 "$TMP/big.rc.err"))" \
  "[ '$rc' = 4 ] && grep -q '^strata: out of memory: the step is predicted not to fit in this host.s memory: predicted [0-9]* B (1 device x peak [0-9]* B' '$TMP/big.rc.err' && grep -q 'MemAvailable [0-9.]* GiB less [0-9.]* GiB kept free' '$TMP/big.rc.err' && grep -q 'No single-device policy tried fits' '$TMP/big.rc.err' && grep -q 'runtime.device_memory_bytes' '$TMP/big.rc.err'"
check "refused with a peak RSS under 1 GB (was $rss B)" "[ '$rss' -gt 0 ] && [ '$rss' -lt 1000000000 ]"
check "a fit event: host scope, does not fit, the limit below MemAvailable" \
  "ev '$TMP/big' fit | $PY -c 'import json,sys; f=json.loads(sys.stdin.read()); h=f[\"host_memory\"]; assert f[\"limit_scope\"]==\"host\" and f[\"fits\"] is False and f[\"need_bytes\"]>10**12 and 0<f[\"device_memory_bytes\"]==h[\"available_bytes\"]-h[\"kept_free_bytes\"] and h[\"kept_free_bytes\"]>=min(2**30, h[\"available_bytes\"]//2), f'"
check "the failed event: class memory, exit 4" "ev '$TMP/big' failed | grep -q '\"exit_code\": 4, \"class\": \"memory\"'"
check "refused before init: no run event, no memory event, no step" \
  "! ev '$TMP/big' run | grep -q . && ! ev '$TMP/big' memory | grep -q . && ! grep -q '\"loss\"' '$TMP/big/metrics.jsonl' 2>/dev/null"

(ulimit -v $VLIMIT_KB && "$STRATA" plan --fit "${BASE[@]}" "${BIG[@]}" >"$TMP/fit.out" 2>"$TMP/fit.err")
rc=$?
check "plan --fit: exit 4, DOES NOT FIT in bytes of host memory" \
  "[ $rc = 4 ] && grep -q '^# fit: DOES NOT FIT: [0-9]* (1 x [0-9]* device + [0-9]* host) > [0-9]* bytes of host memory' '$TMP/fit.out' && grep -q 'predicted not to fit in this host.s memory' '$TMP/fit.err'"

peak_rss_run "$TMP/sup.rc" "$STRATA" run "${BASE[@]}" "${BIG[@]}" run.dir="$TMP/sup" recovery.backoff_s=0
read -r rc rss <"$TMP/sup.rc"
check "strata run: exit 4, not restarted (one attempt, giving_up with class memory)" \
  "[ '$rc' = 4 ] && grep -q '\"outcome\": \"not_restartable\"' '$TMP/sup/recovery.json' && grep -q '\"attempts\": 1,' '$TMP/sup/recovery.json' && grep -q '\"restarts\": 0,' '$TMP/sup/recovery.json' && ev '$TMP/sup' giving_up | grep -q '\"class\": \"memory\"' && grep -q 'exited 4 (out of memory); not restarting' '$TMP/sup.rc.err'"

# --- 2. an explicit runtime.device_memory_bytes wins ---------------------------------
(ulimit -v $VLIMIT_KB && "$STRATA" plan --fit "${BASE[@]}" "${BIG[@]}" runtime.device_memory_bytes=2000000000000 >"$TMP/fit2.out" 2>&1)
rc=$?
check "plan --fit with runtime.device_memory_bytes=2 TB: fits that limit, per device (exit $rc)" \
  "[ $rc = 0 ] && grep -q '^# fit: fits: [0-9]* <= 2000000000000 bytes of device memory (runtime.device_memory_bytes)' '$TMP/fit2.out'"

# --- 3. a real allocation failure ------------------------------------------------
peak_rss_run "$TMP/oom.rc" "$STRATA" train "${BASE[@]}" "${BIG[@]}" runtime.device_memory_bytes=2000000000000 run.dir="$TMP/oom"
read -r rc rss <"$TMP/oom.rc"
check "allocation failure: exit 4 (no abort), the bytes and the advice on stderr (exit $rc: $(tail -c 300 "$TMP/oom.rc.err"))" \
  "[ '$rc' = 4 ] && grep -q '^strata: out of memory: allocating [0-9]* bytes of host memory failed' '$TMP/oom.rc.err' && grep -q 'set runtime.device_memory_bytes' '$TMP/oom.rc.err'"
check "allocation failure: the last event is failed, class memory" \
  "tail -1 '$TMP/oom/events.jsonl' | grep -q '\"event\": \"failed\", \"error\": \"allocating [0-9]* bytes of host memory failed.*\"exit_code\": 4, \"class\": \"memory\"'"
peak_rss_run "$TMP/oomsup.rc" "$STRATA" run "${BASE[@]}" "${BIG[@]}" runtime.device_memory_bytes=2000000000000 run.dir="$TMP/oomsup" recovery.backoff_s=0
read -r rc rss <"$TMP/oomsup.rc"
check "allocation failure under strata run: not restarted" \
  "[ '$rc' = 4 ] && grep -q '\"outcome\": \"not_restartable\"' '$TMP/oomsup/recovery.json' && grep -q '\"attempts\": 1,' '$TMP/oomsup/recovery.json'"

# --- 4. what fits still runs --------------------------------------------------------
"$STRATA" train "${BASE[@]}" train.steps=2 run.dir="$TMP/small" >/dev/null 2>"$TMP/small.err"
rc=$?
check "a small run fits the host's memory: trains, its fit event says host and fits (exit $rc)" \
  "[ $rc = 0 ] && ev '$TMP/small' fit | grep -q '\"fits\": true.*\"limit_scope\": \"host\"'"
"$STRATA" plan --fit "${BASE[@]}" parallel.data=2 >"$TMP/dp.out" 2>&1
rc=$?
check "two devices: both devices' peaks counted against the host (exit $rc)" \
  "[ $rc = 0 ] && grep -q '^# fit: fits: [0-9]* (2 x [0-9]* device + [0-9]* host) <= [0-9]* bytes of host memory' '$TMP/dp.out'"

finish test_memory.sh
