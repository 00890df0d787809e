#!/usr/bin/env bash
# make setup: idempotent set-up of everything strata's build and run need;
# `scripts/setup.sh --test` (make setup-test, which make test calls) adds
# what only the tests and reports need.
#   1. Debian packages (apt-get) when a header or tool is missing;
#   2. .venv with the pins of requirements.lock (jax needs Python >= 3.12);
#   3. python/strata_jax installed editable into .venv.
# A stamp file records the hash of the pins so a second run is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."

# Building and running (make run): compiler, CMake, the libraries strata
# links (static archives come with the -dev packages, for build-portable)
# and the fortunes corpus the default run trains on. Open MPI (mpirun and
# libmpi, 4.1 on bookworm) for multi-process runs (docs/multiprocess.md);
# Debian ships no static libmpi, so build-portable leaves MPI out.
DEBS="cmake make gcc pkg-config libyaml-dev libxxhash-dev libjansson-dev libssl-dev fortunes libmicrohttpd-dev libprotobuf-c-dev protobuf-c-compiler openmpi-bin libopenmpi-dev"
# Tests only: cmocka (C tests), clang and its runtime (libFuzzer, the
# sanitizers' fuzz builds), chromium (report.html rendered headless in
# test_report.py), graphviz (the --dot graphs checked by dot).
TEST_DEBS="libcmocka-dev clang libclang-rt-14-dev chromium graphviz"
if [ "${1:-}" = "--test" ]; then DEBS="$DEBS $TEST_DEBS"; fi
missing=""
for p in $DEBS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

find_python() {
  for c in "${STRATA_PYTHON:-}" python3.12 python3.13 /root/.pyenv/versions/3.12*/bin/python3.12 \
           /root/.pyenv/versions/3.13*/bin/python3.13 /usr/bin/python3.13 /usr/bin/python3 python3; do
    [ -n "$c" ] || continue
    command -v "$c" >/dev/null 2>&1 || [ -x "$c" ] || continue
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}

stamp=.venv/.strata-setup
want="$(sha256sum requirements.lock python/pyproject.toml | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/python ]; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  py="$(find_python)" || { echo "setup: jax 0.11.2 needs Python >= 3.12; none found (set STRATA_PYTHON)" >&2; exit 1; }
  echo "setup: creating .venv with $py"
  "$py" -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -r requirements.lock
.venv/bin/pip install -q --disable-pip-version-check --no-deps -e python
echo "$want" > "$stamp"
echo "setup: .venv ready ($(.venv/bin/python -c 'import jax; print("jax", jax.__version__)'))"
