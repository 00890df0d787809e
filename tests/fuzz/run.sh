#!/usr/bin/env bash
# run.sh [TARGET...] — builds the libFuzzer targets (clang, libFuzzer +
# ASan + UBSan) and fuzzes each one; docs/fuzzing.md describes them.
#
#   config         YAML, overrides, schema, writers   (fuzz_config.c)
#   safetensors    safetensors files                  (fuzz_safetensors.c)
#   ckpt_manifest  checkpoint manifest.json           (fuzz_ckpt_manifest.c)
#   bundle         bundle manifest.json               (fuzz_bundle.c)
#   tokens         token files                        (fuzz_tokens.c)
#   tokenizer      tokenizer.json (byte-level BPE)    (fuzz_tokenizer.c)
#   json           the JSON reader                    (fuzz_json.c)
#   mlir_sig       MLIR `@main` signatures             (fuzz_mlir_sig.c)
#   report         run logs and the report page         (fuzz_report.c)
#   diff           two run directories and strata diff  (fuzz_diff.c)
#   ir             StableHLO programs (the analyzer)   (fuzz_ir.c)
#   compare        step dumps (strata compare)         (fuzz_compare.c)
#
# Budget: FUZZ_SECONDS (default 60) is the total, split evenly over the
# targets (`make test-fuzz`, the CI run); or FUZZ_RUNS executions per
# target with no time limit (`make fuzz-long`: 1000000). FUZZ_JOBS targets
# run at once (default 1). FUZZ_OUT is the output folder (default
# build-fuzz). The working corpus is <out>/corpus/<target>/, seeded from tests/fuzz/corpus/<target>/
# (committed seeds, regression inputs included) by make_corpus.sh; crash
# inputs land in build-fuzz/<target>-crash-*. A summary line per target
# (executions, seconds, coverage) goes to stdout and build-fuzz/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${FUZZ_OUT:-build-fuzz}
all=(config safetensors ckpt_manifest bundle tokens tokenizer json mlir_sig report diff ir compare)
if [ $# -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi
seconds=${FUZZ_SECONDS:-60}
runs=${FUZZ_RUNS:-}
mkdir -p "$out/obj"

max_len() {
  case $1 in
    config) echo 8192 ;;
    tokens) echo 4096 ;;
    mlir_sig) echo 32768 ;;
    ir) echo 65536 ;;
    *) echo 65536 ;;
  esac
}

CC=${FUZZ_CC:-clang}
# obs's TensorBoard protos (src/obs/tb_event.proto), generated as CMake does.
mkdir -p "$out/gen"
protoc-c --c_out="$out/gen" --proto_path=src/obs tb_event.proto
# The tables generated from the kernel contract (the config schema's
# kernels.<op> rows), as CMake generates them.
cmake -DPROJECT_SOURCE_DIR="$PWD" -DOUT="$out/gen" -P cmake/kernel_tables.cmake
CFLAGS=(-g -O1 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fno-omit-frame-pointer
  -fsanitize=address,undefined -fno-sanitize-recover=all -Iinclude -Isrc -I"$out/gen" -DSTRATA_SOURCE_DIR="\"$PWD\"")
# shellcheck disable=SC2207
LIBS=($(pkg-config --cflags --libs yaml-0.1 jansson libxxhash libcrypto libprotobuf-c) -lpthread -ldl -lm)

# The parsers, built once into an archive: each target pulls what it uses.
sources=(src/base/*.c src/config/*.c src/ckpt/*.c src/bundle/*.c src/data/*.c
  src/runtime/dtype.c src/runtime/mlir_sig.c src/obs/*.c src/ir/*.c src/diag/compare.c "$out/gen/tb_event.pb-c.c")
rm -f "$out"/obj/*.o "$out/libparsers.a"
jobs_max=$(nproc 2>/dev/null || echo 2)
pids=()
for src in "${sources[@]}"; do
  "$CC" "${CFLAGS[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$out/obj/$(echo "$src" | tr / _).o" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs_max" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p"; done
ar rcs "$out/libparsers.a" "$out"/obj/*.o
for t in "${targets[@]}"; do
  "$CC" "${CFLAGS[@]}" -fsanitize=fuzzer "tests/fuzz/fuzz_$t.c" "$out/libparsers.a" "${LIBS[@]}" -o "$out/fuzz_$t"
done

tests/fuzz/make_corpus.sh "$out/corpus"
per=$(( seconds / ${#targets[@]} ))
[ "$per" -ge 1 ] || per=1
: >"$out/summary.txt"
jobs_max=${FUZZ_JOBS:-1}

# run_one TARGET: fuzzes it; writes <out>/TARGET.summary and, on failure,
# <out>/TARGET.failed.
run_one() {
  local t=$1 limit what dict=() status start ms execs cov
  rm -f "$out/$t.failed"
  if [ -n "$runs" ]; then limit=(-runs="$runs"); what="$runs runs"; else limit=(-max_total_time="$per"); what="${per}s"; fi
  [ -s "$out/corpus/$t.dict" ] && dict=(-dict="$out/corpus/$t.dict")
  echo "fuzz: $t for $what on $out/corpus/$t"
  start=$(date +%s%N)
  if "$out/fuzz_$t" "${limit[@]}" -timeout=10 -max_len="$(max_len "$t")" "${dict[@]}" -artifact_prefix="$out/$t-" \
    -print_final_stats=1 "$out/corpus/$t" 2>"$out/$t.log"; then
    status=ok
  else
    status="FAILED (exit $?)"
    touch "$out/$t.failed"
    tail -40 "$out/$t.log"
    echo "fuzz: $t FAILED; the input is in $out/ ($t-crash-*, $t-leak-*, $t-timeout-*)"
  fi
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t.log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$out/$t.log" | tail -1)
  printf '%-14s %-8s execs %-9s %5d.%01ds  %s\n' "$t" "$status" "${execs:-?}" $((ms / 1000)) $((ms % 1000 / 100)) "${cov:-}" |
    tee "$out/$t.summary"
}

pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs_max" ]; then wait "${pids[0]}" || true; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || true; done
failed=()
for t in "${targets[@]}"; do
  cat "$out/$t.summary" >>"$out/summary.txt"
  [ ! -e "$out/$t.failed" ] || failed+=("$t")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}"
  exit 1
fi
echo "fuzz: ok, ${#targets[@]} targets, no crash, leak or sanitizer report"
