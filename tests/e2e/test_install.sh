#!/usr/bin/env bash
# test_install.sh — `cmake --install` into a temporary prefix and the
# front-end through pip (docs/install.md): the files land under the prefix,
# strata.pc names that prefix and links a small C program against the
# installed archives, and the installed binary runs `doctor` and a 2-step
# `train` from a folder outside the repository with the pip-installed
# front-end, with no source tree to fall back on. Run from the repository
# root after `make build`; nothing is downloaded.
set -uo pipefail

BUILD=${STRATA_BUILD_DIR:-build}
# -s: a venv's python is a symlink, and only its own path keeps the venv.
PY=$(realpath -s "${PY:-.venv/bin/python}")
TMP=$(mktemp -d /tmp/strata-e2e-install-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
source "$(dirname "$0")/lib.sh"
P="$TMP/prefix"

# --- cmake --install ----------------------------------------------------------
if cmake --install "$BUILD" --prefix "$P" >"$TMP/install.log" 2>&1; then ok; else bad "cmake --install: $(tail -3 "$TMP/install.log")"; fi
check "bin/strata is installed and runs" "[ -x '$P/bin/strata' ] && '$P/bin/strata' --help >/dev/null 2>&1"
for h in include/strata/*.h; do
  check "header $h installed" "cmp -s '$h' '$P/$h'"
done
LIBDIR=$(cd "$P" && ls -d lib lib64 2>/dev/null | head -1)
for m in base config data bundle ckpt obs runtime sched diag train; do
  check "lib$LIBDIR/libstrata_$m.a installed" "[ -s '$P/$LIBDIR/libstrata_$m.a' ]"
done
PC="$P/$LIBDIR/pkgconfig/strata.pc"
check "strata.pc names the install prefix" "grep -qx 'prefix=$P' '$PC'"
export PKG_CONFIG_PATH="$P/$LIBDIR/pkgconfig"
FLAGS=$(pkg-config --cflags --libs strata 2>"$TMP/pc.err")
check "pkg-config --cflags --libs strata works" "[ -n '$FLAGS' ] && [ ! -s '$TMP/pc.err' ]"
check "pkg-config points at the prefix's include and lib folders" \
  "echo '$FLAGS' | grep -q -- '-I$P/include' && echo '$FLAGS' | grep -q -- '-L$P/$LIBDIR' && echo '$FLAGS' | grep -q -- '-lstrata_train.*-lstrata_base'"

# --- a C program against the installed library ----------------------------------
cat >"$TMP/use.c" <<'EOF'
#include <stdio.h>
#include <strata/config.h>
#include <strata/status.h>

int main(void) {
  char ok_arg[] = "train.steps=7", bad_arg[] = "train.stepz=7";
  char* good[] = {ok_arg};
  char* bad[] = {bad_arg};
  st_config* c = NULL;
  st_status s = st_config_load(NULL, 1, good, &c);
  if (s) return 10;
  printf("steps=%lld\n", (long long)st_config_int(c, "train.steps"));
  st_config_destroy(c);
  s = st_config_load(NULL, 1, bad, &c);
  printf("exit=%d %s\n", st_status_exit_code(s), st_status_message(s));
  st_status_free(s);
  return 0;
}
EOF
# Only the installed headers and archives: no -I into the repository.
if cc -std=c11 -Wall -Wextra -Werror "$TMP/use.c" -o "$TMP/use" $FLAGS 2>"$TMP/cc.err"; then ok; else bad "compiling against the install: $(head -5 "$TMP/cc.err")"; fi
"$TMP/use" >"$TMP/use.out" 2>&1
check "the linked program runs st_config_load" "grep -qx 'steps=7' '$TMP/use.out'"
check "and gets the config error's exit code and its 'did you mean'" "grep -q '^exit=2 .*did you mean' '$TMP/use.out'"

# --- the front-end through pip ----------------------------------------------------
# --no-build-isolation/--no-index: the build uses the environment's own
# setuptools (requirements.lock) and fetches nothing.
SITE="$TMP/site"
if "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation --no-index --target "$SITE" ./python \
  >"$TMP/pip.log" 2>&1; then
  ok
else
  bad "pip install ./python (setuptools in $PY? run make setup): $(tail -3 "$TMP/pip.log")"
fi
check "strata_jax landed in the target" "[ -f '$SITE/strata_jax/export.py' ]"
check "python/pyproject.toml pins what requirements.lock pins" "'$PY' - <<'PYEOF'
import re, tomllib
lock = dict(l.split('==') for l in open('requirements.lock').read().split() if '==' in l)
lock = {re.sub('[-_.]+', '-', k).lower(): v for k, v in lock.items()}
proj = tomllib.load(open('python/pyproject.toml', 'rb'))['project']
deps = proj['dependencies'] + [d for ds in proj['optional-dependencies'].values() for d in ds]
assert deps
for d in deps:
    name, ver = d.split('==')
    assert lock[re.sub('[-_.]+', '-', name).lower()] == ver, d
PYEOF"

# --- the installed binary, away from the repository --------------------------------
# What docs/install.md tells a user to set: STRATA_PYTHON, the venv's
# Python that has jax and the front-end; the plugin is then found in that
# venv. STRATA_SOURCE_DIR names an empty folder so neither the repository's
# .venv nor its python/ can stand in.
PLUGIN=$(ls "$(dirname "$(dirname "$PY")")"/lib/python3*/site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so 2>/dev/null | tail -1)
check "the venv of $PY has the CPU plugin (make setup)" "[ -n '$PLUGIN' ]"
mkdir -p "$TMP/work/configs" "$TMP/nosrc"
cp configs/base.yml configs/test.yml "$TMP/work/configs/"
run_installed() {
  (cd "$TMP/work" && env -u STRATA_PJRT_PLUGIN STRATA_PYTHON="$PY" PYTHONPATH="$SITE" \
    STRATA_SOURCE_DIR="$TMP/nosrc" STRATA_CACHE_DIR="$TMP/cache" "$P/bin/strata" "$@")
}
check "the front-end the exporter imports is the pip-installed one" \
  "(cd '$TMP/work' && PYTHONPATH='$SITE' '$PY' -c 'import strata_jax; print(strata_jax.__file__)') | grep -q '^$SITE/strata_jax/'"
if run_installed doctor >"$TMP/doctor.out" 2>&1; then ok; else bad "installed doctor: $(tail -3 "$TMP/doctor.out")"; fi
check "doctor: the plugin of the venv, status ok" \
  "grep -q '^plugin: *$PLUGIN' '$TMP/doctor.out' && grep -Eq '^status: +ok' '$TMP/doctor.out'"
if run_installed train configs/test.yml train.steps=2 train.eval_every=2 run.progress=off run.dir="$TMP/work/run" \
  >"$TMP/train.out" 2>&1; then ok; else bad "installed train: $(tail -5 "$TMP/train.out")"; fi
check "train ran 2 steps" "[ \$(grep -c '\"loss\"' '$TMP/work/run/metrics.jsonl' 2>/dev/null) = 2 ]"
# The bundle key covers the front-end that exports (here the pip-installed
# one, no source tree): a changed exporter source must give a new bundle.
nb() { find "$TMP/cache/bundles" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l; }
check "one bundle after train" "[ \$(nb) = 1 ]"
echo "# changed" >>"$SITE/strata_jax/model.py"
if run_installed export configs/test.yml >"$TMP/export.out" 2>&1; then ok; else bad "installed export: $(tail -5 "$TMP/export.out")"; fi
check "a changed pip-installed front-end gives a new bundle key" "[ \$(nb) = 2 ]"

finish test_install
