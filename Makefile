# Thin wrapper over CMake and pytest: these targets are what README.md promises.
#   make run    set up, build, train configs/tiny.yml on the fortunes corpus
#   make test   set up, build, run every test (C under ASan+UBSan, pytest, e2e)
.PHONY: test-py-stream1 test-py-stream2 setup setup-test build build-asan build-portable run test test-c test-py test-e2e test-long bench bench-check bench-baselines clean

JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PY := .venv/bin/python

# setup: what building and running need; setup-test adds the test-only
# Debian packages (cmocka, clang for fuzzing, chromium, graphviz).
setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

build: setup
	@cmake -S . -B build -DSTRATA_TESTS=OFF >/dev/null
	@cmake --build build -j $(JOBS)

# The binary to carry to a lent GPU machine (docs/performance.md, "GPU"):
# libyaml, libjansson, libxxhash, libcrypto and libprotobuf-c linked in, only glibc needed there.
build-portable: setup
	@cmake -S . -B build-portable -DSTRATA_TESTS=OFF -DSTRATA_STATIC_DEPS=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build-portable -j $(JOBS)

build-asan: setup-test
	@cmake -S . -B build-asan -DSTRATA_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	@cmake --build build-asan -j $(JOBS)

run: build
	@./build/strata train configs/tiny.yml

# Each runner prints its own summary; the first failure fails the target,
# but every runner still runs so the summaries are complete. Two streams run
# side by side (TEST_STREAMS=1: one after the other): pytest but for
# PY_STREAM2, and the C tests, the end-to-end scripts, the fuzz smoke and
# PY_STREAM2's pytest files; each stream's output is
# kept in build/test-logs/ and printed when it ends. Each stream is mostly
# one process at a time that uses one core (export, tracing, a small
# model's steps), so two streams fill two cores. The last line is the wall
# time of the whole target, set-up and builds included (the budget: under
# 12 minutes on 2 cores; tests/README.md).
TEST_STREAMS ?= 2
test:
	@start=$$(date +%s); rc=0; \
	$(MAKE) --no-print-directory setup-test build build-asan build-portable || rc=1; \
	built=$$(date +%s); \
	if [ $$rc = 0 ]; then \
	  mkdir -p build/test-logs; \
	  if [ "$(TEST_STREAMS)" = 1 ]; then \
	    $(MAKE) --no-print-directory test-c || rc=1; \
	    $(MAKE) --no-print-directory test-py || rc=1; \
	    $(MAKE) --no-print-directory test-e2e || rc=1; \
	    $(MAKE) --no-print-directory test-fuzz || rc=1; \
	  else \
	    ( $(MAKE) --no-print-directory test-py-stream1 > build/test-logs/py.log 2>&1; echo $$? > build/test-logs/py.rc; \
	      echo "stream 1 (pytest): $$(( $$(date +%s) - built )) s" >> build/test-logs/py.log ) & \
	    ( r=0; $(MAKE) --no-print-directory test-c || r=1; $(MAKE) --no-print-directory test-e2e || r=1; \
	      $(MAKE) --no-print-directory test-fuzz || r=1; $(MAKE) --no-print-directory test-py-stream2 || r=1; \
	      echo $$r > build/test-logs/rest.rc; \
	      echo "stream 2 (C, e2e, fuzz, pytest of PY_STREAM2): $$(( $$(date +%s) - built )) s" ) > build/test-logs/rest.log 2>&1; \
	    wait; \
	    echo "==== C tests, end-to-end scripts, fuzz smoke, pytest of the anchors and bench (build/test-logs/rest.log)"; cat build/test-logs/rest.log; \
	    echo "==== pytest (build/test-logs/py.log)"; cat build/test-logs/py.log; \
	    [ "$$(cat build/test-logs/py.rc)" = 0 ] || rc=1; [ "$$(cat build/test-logs/rest.rc)" = 0 ] || rc=1; \
	  fi; \
	fi; \
	end=$$(date +%s); \
	echo "make test: $$((end - start)) s in all ($$((built - start)) s set-up and builds), $$([ $$rc = 0 ] && echo passed || echo FAILED)"; \
	exit $$rc

test-c:
	@cd build-asan && ASAN_OPTIONS=$${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/c/lsan.supp:print_suppressions=0 \
	  ctest --output-on-failure -j 1

# The pytest files the second stream runs after the C tests, the e2e scripts
# and the fuzz smoke (the anchors, the bench pipeline, the checkpoint
# resharding and tensor-parallel training files, packing and the data contract), so both streams end at
# about the same time; `make test-py` runs them all.
PY_STREAM2 ?= tests/py/test_anchor.py tests/py/test_anchor_mesh.py tests/py/test_bench.py tests/py/test_tensor_train.py \
  tests/py/test_packing_train.py tests/py/test_data_contract.py tests/py/test_data_inspect.py
test-py:
	@$(PY) -m pytest -q --durations=40 -m "not long" tests/py

test-py-stream1:
	@$(PY) -m pytest -q --durations=40 -m "not long" $(addprefix --ignore=,$(PY_STREAM2)) tests/py

test-py-stream2:
	@$(PY) -m pytest -q --durations=10 -m "not long" $(PY_STREAM2)

# The long drills (tests/README.md): what make test leaves out, each with a
# shorter test of the same thing that make test keeps.
# Then the numeric tests again with XLA's CPU code generation limited to
# AVX2 and to SSE4.2, and strata's C kernels on their portable path: every
# tolerance must hold for another machine's code (tests/README.md,
# "Tolerances").
NUMERIC_TESTS ?= tests/py
test-long: build build-portable
	@rc=0; \
	$(PY) -m pytest -q --durations=20 -m long tests/py || rc=1; \
	STRATA_TEST_FULL=1 bash tests/e2e/test_sched.sh || rc=1; \
	STRATA_TEST_FULL=1 bash tests/e2e/test_kernels.sh || rc=1; \
	STRATA_TEST_FULL=1 bash tests/e2e/test_multiprocess.sh || rc=1; \
	for isa in AVX2 SSE4_2; do \
	  echo "== numeric tests with XLA_FLAGS=--xla_cpu_max_isa=$$isa STRATA_KERNELS_ISA=portable"; \
	  XLA_FLAGS=--xla_cpu_max_isa=$$isa STRATA_KERNELS_ISA=portable $(PY) -m pytest -q -m "not long" $(NUMERIC_TESTS) || rc=1; \
	done; \
	exit $$rc

test-e2e:
	@tests/e2e/run_all.sh

# Golden numerics (tests/golden/README.md): rerun every case, print what
# changed, write the records with the reason (the commit repeats it).
# GOLDEN_CASES="moe-tiny gpt2-124m" limits it; `make golden-check` writes nothing.
.PHONY: golden golden-check
GOLDEN_CASES ?=
golden: build
	@if [ -z "$(REASON)" ]; then echo 'make golden: say why the numbers may change: make golden REASON="..."' >&2; exit 2; fi
	@$(PY) tests/golden/regen.py --reason "$(REASON)" $(GOLDEN_CASES)

golden-check: build
	@$(PY) tests/golden/regen.py --check $(GOLDEN_CASES)

# Benchmarks against the monolithic jax.jit anchors (docs/performance.md):
# ≈ 10-15 min on 2 cores; results in bench/results/. BENCH_ARGS="--quick"
# checks the pipeline in ~2 min, "--sections step,compile" runs a subset.
bench: build
	@$(PY) bench/run.py $(BENCH_ARGS)

# The committed performance baselines (bench/baselines/, docs/performance.md
# "Baselines"): bench-check re-measures the short set (~2 min on 2 cores)
# and exits 1 naming each figure beyond its tolerance; bench-baselines
# regenerates them from BENCH_REPEAT runs (~7 min). BENCH_CHECK_ARGS="--slow
# block_fwd_res:0.3" is the drill that must fail.
BENCH_REPEAT ?= 5
bench-check: build
	@$(PY) bench/check.py $(BENCH_CHECK_ARGS)

bench-baselines: build
	@$(PY) bench/check.py --update --repeat $(BENCH_REPEAT)

clean:
	rm -rf build build-asan build-portable build-fuzz

# Fuzzing (tests/fuzz/run.sh, docs/fuzzing.md): libFuzzer + ASan + UBSan
# over every parser of untrusted input (config, safetensors, checkpoint
# manifest, bundle manifest, token file, JSON, MLIR signature, step dump). Crashes land
# in build-fuzz/. FUZZ_SECONDS is the total, split over the targets:
# `make test` runs test-fuzz (24 s, the CI run's smoke: 2 s a target, 12 targets). `make fuzz-long` runs
# FUZZ_LONG_RUNS executions per target (10^6; about an hour on one core).
# FUZZ_TARGETS="bundle json" limits a run to some targets.
.PHONY: fuzz test-fuzz fuzz-long
FUZZ_SECONDS ?= 60
TEST_FUZZ_SECONDS ?= 24
FUZZ_LONG_RUNS ?= 1000000
FUZZ_TARGETS ?=

fuzz:
	@FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh $(FUZZ_TARGETS)

test-fuzz:
	@FUZZ_SECONDS=$(TEST_FUZZ_SECONDS) tests/fuzz/run.sh $(FUZZ_TARGETS)

fuzz-long:
	@FUZZ_RUNS=$(FUZZ_LONG_RUNS) tests/fuzz/run.sh $(FUZZ_TARGETS)
