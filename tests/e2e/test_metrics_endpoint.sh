#!/usr/bin/env bash
# test_metrics_endpoint.sh — obs.metrics_port (issue 16 item 5): a run
# serves its latest metrics in the Prometheus text format on 127.0.0.1 while
# it trains; two scrapes with curl parse (tests/e2e/metrics_scrape.py), the
# step grows between them and every value equals metrics.jsonl's line of
# that step; other paths are 404; the socket listens on loopback only; a
# port in use is exit 2 naming the key and the port, before any step.
# Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d /tmp/strata-e2e-metrics-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

source "$(dirname "$0")/lib.sh"
HERE=$(realpath "$(dirname "$0")")
scrape() { python3 "$HERE/metrics_scrape.py" "$@"; }

free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
BASE=(configs/test.yml runtime.deterministic=true run.progress=off)

# --- a port in use ----------------------------------------------------------
python3 -c "
import socket, sys, time
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(120)" >"$TMP/held" &
PIDS+=("$!")
for _ in $(seq 50); do [ -s "$TMP/held" ] && break; sleep 0.1; done
HELD=$(cat "$TMP/held")
d="$TMP/inuse"
"$STRATA" train "${BASE[@]}" obs.metrics_port="$HELD" run.dir="$TMP/probe" >"$TMP/probe.out" 2>&1
if grep -q "built without the metrics endpoint" "$TMP/probe.out"; then
  # `make build-portable` leaves the endpoint out (docs/using.md): its
  # refusal, exit 2 before anything runs, is all there is to check.
  expect_exit 2 "config error: obs.metrics_port=$HELD: this strata binary was built without the metrics endpoint" \
    train "${BASE[@]}" obs.metrics_port="$HELD" run.dir="$TMP/portable"
  finish test_metrics_endpoint.sh
  exit
fi
expect_exit 2 "config error: obs.metrics_port=$HELD: cannot serve metrics on 127.0.0.1:$HELD \(.*Address already in use\)" \
  train "${BASE[@]}" ckpt.every=1 obs.metrics_port="$HELD" run.dir="$d"
check "port in use: no step ran, no checkpoint, no data or compile event" \
  "! grep -q '\"loss\"' '$d/metrics.jsonl' && [ ! -e '$d/checkpoints' ] && ! grep -Eq '\"event\": \"(data|compile|run)\"' '$d/events.jsonl'"
check "port in use: a failed event with exit code 2" "grep -q '\"event\": \"failed\".*obs.metrics_port=$HELD.*\"exit_code\": 2' '$d/events.jsonl'"
# The folder holds no run: the same run.dir trains once the key is fixed.
if "$STRATA" train "${BASE[@]}" train.steps=2 run.dir="$d" >/dev/null 2>"$TMP/err"; then ok; else bad "retrying in the same run.dir: $(tail -2 "$TMP/err")"; fi

# --- a running run ----------------------------------------------------------
PORT=$(free_port)
d="$TMP/run"
"$STRATA" train "${BASE[@]}" train.steps=1000000 train.eval_every=20 obs.metrics_port="$PORT" run.dir="$d" \
  >"$TMP/train.out" 2>"$TMP/train.err" &
pid=$!
PIDS+=("$pid")
URL="http://127.0.0.1:$PORT/metrics"
# Up and past the first step: compile takes seconds on a cold cache.
step1=0
for _ in $(seq 600); do
  if curl -sf "$URL" -o "$TMP/s1" 2>/dev/null && step1=$(scrape parse "$TMP/s1" 2>/dev/null) && [ "$step1" -ge 1 ]; then
    break
  fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
check "the endpoint answered with a step during the run (stderr: $(tail -2 "$TMP/train.err"))" "[ '$step1' -ge 1 ]"
check "the first scrape parses as the exposition format" "scrape parse '$TMP/s1' >/dev/null"
step2=$step1
for _ in $(seq 300); do
  curl -sf "$URL" -o "$TMP/s2" -D "$TMP/h2" && step2=$(scrape parse "$TMP/s2") && [ "$step2" -gt "$step1" ] && break
  sleep 0.1
done
check "the step grows between two scrapes ($step1, then $step2)" "[ '$step2' -gt '$step1' ]"
check "Content-Type is text/plain; version=0.0.4" "grep -qi '^content-type: text/plain; version=0.0.4' '$TMP/h2'"
check "names: strata_loss, strata_tokens_per_second, strata_step_time_seconds, strata_peak_live_by_category_bytes{category=\"params\"}, run label" \
  "grep -q '^strata_loss{run=\"run\"} ' '$TMP/s2' && grep -q '^strata_tokens_per_second{' '$TMP/s2' && grep -q '^strata_step_time_seconds{' '$TMP/s2' && grep -q '^strata_peak_live_by_category_bytes{run=\"run\",category=\"params\"} [0-9]' '$TMP/s2' && grep -q '^# TYPE strata_loss gauge$' '$TMP/s2'"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/")
check "another path is 404 (got $code)" "[ '$code' = 404 ]"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$URL")
check "POST /metrics is 405 (got $code)" "[ '$code' = 405 ]"
check "the port listens on 127.0.0.1 only" "scrape loopback '$PORT'"
check "the metrics_endpoint event names the URL" \
  "grep -q '\"event\": \"metrics_endpoint\", \"url\": \"http://127.0.0.1:$PORT/metrics\", \"port\": $PORT}' '$d/events.jsonl'"
"$STRATA" status "$d" >"$TMP/st" 2>&1
check "strata status names the endpoint while running" "grep -q '^metrics  *http://127.0.0.1:$PORT/metrics$' '$TMP/st'"
"$STRATA" status "$d" --json >"$TMP/stj" 2>&1
check "strata status --json: metrics_url" \
  "python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))[\"metrics_url\"] != sys.argv[2])' '$TMP/stj' '$URL'"
kill -TERM "$pid"
wait "$pid"
rc=$?
check "SIGTERM stops the run (exit 8, got $rc)" "[ '$rc' = 8 ]"
# Both scrapes against metrics.jsonl, now complete up to the stop.
if scrape match "$d" "$TMP/s1" >/dev/null 2>"$TMP/m1"; then ok; else bad "first scrape vs metrics.jsonl: $(cat "$TMP/m1")"; fi
if scrape match "$d" "$TMP/s2" >/dev/null 2>"$TMP/m2"; then ok; else bad "second scrape vs metrics.jsonl: $(cat "$TMP/m2")"; fi
check "the endpoint is gone with the process" "! curl -sf '$URL' -o /dev/null"
"$STRATA" status "$d" --json >"$TMP/stj" 2>&1
check "strata status --json: metrics_url null once stopped" \
  "python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))[\"metrics_url\"] is not None)' '$TMP/stj'"

finish test_metrics_endpoint.sh
