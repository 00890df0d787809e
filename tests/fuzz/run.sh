#!/usr/bin/env bash
# run.sh — builds the config fuzz target with clang (libFuzzer + ASan +
# UBSan) from src/config and src/base (with the libraries CMake links
# them with), seeds the corpus, and fuzzes for
# $FUZZ_SECONDS (default 60). Crash inputs land in build-fuzz/.
# `make fuzz` and `make test-fuzz` call this.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${FUZZ_SECONDS:-60}
out=build-fuzz
mkdir -p "$out"

CC=${FUZZ_CC:-clang}
# shellcheck disable=SC2046
"$CC" -g -O1 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
  -Iinclude -Isrc -DSTRATA_SOURCE_DIR="\"$PWD\"" \
  tests/fuzz/fuzz_config.c src/config/*.c src/base/*.c \
  $(pkg-config --cflags --libs yaml-0.1 jansson libxxhash libcrypto) -lpthread -ldl -lm \
  -o "$out/fuzz_config"

tests/fuzz/make_corpus.sh "$out/corpus"
echo "fuzz: running $out/fuzz_config for ${seconds}s on $out/corpus"
"$out/fuzz_config" -max_total_time="$seconds" -timeout=10 -max_len=8192 \
  -dict="$out/corpus.dict" -artifact_prefix="$out/" -print_final_stats=1 "$out/corpus" 2>"$out/fuzz.log" || {
  rc=$?
  tail -60 "$out/fuzz.log"
  echo "fuzz: FAILED (exit $rc); the crashing input is in $out/ (crash-*, leak-*, timeout-*)"
  exit 1
}
grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)|^Done' "$out/fuzz.log" || true
echo "fuzz: ok, no crash or sanitizer report in ${seconds}s"
