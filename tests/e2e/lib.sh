# lib.sh — shared by the tests/e2e/test_*.sh scripts (source it after setting
# STRATA and TMP). Counts checks, reports failures on stderr, and prints one
# summary line per script.

checks=0
fails=0
ok() { checks=$((checks + 1)); }
bad() {
  checks=$((checks + 1))
  fails=$((fails + 1))
  echo "FAIL: $*" >&2
}
# check DESCRIPTION SHELL-CONDITION
check() { if eval "$2"; then ok; else bad "$1"; fi; }

# expect_exit RC PATTERN ARGS...: `strata ARGS` exits RC and its stderr or
# stdout matches the extended regex PATTERN.
expect_exit() {
  local rc=$1 pat=$2
  shift 2
  "$STRATA" "$@" >"$TMP/out" 2>"$TMP/err"
  local code=$?
  if [ "$code" != "$rc" ]; then
    bad "strata $*: exit $code, want $rc; stderr: $(tail -3 "$TMP/err")"
  elif ! grep -Eq -- "$pat" "$TMP/err" "$TMP/out"; then
    bad "strata $*: output does not match /$pat/: $(tail -3 "$TMP/err")"
  else
    ok
  fi
}

# expect_config_error DIR RC MESSAGE -- ARGS...: runs `strata ARGS` in DIR and wants
# exit code RC, exactly "strata: config error: MESSAGE" on stderr and nothing
# on stdout.
expect_config_error() {
  local dir=$1 rc=$2 msg=$3
  shift 4
  local out err code
  out=$(cd "$dir" && "$STRATA" "$@" 2>"$TMP/stderr")
  code=$?
  err=$(cat "$TMP/stderr")
  if [ "$code" != "$rc" ]; then
    bad "strata $*: exit $code, want $rc (stderr: $err)"
  elif [ "$err" != "strata: config error: $msg" ]; then
    bad "strata $*: stderr was
  $err
want
  strata: config error: $msg"
  elif [ -n "$out" ]; then
    bad "strata $*: wrote to stdout on error: $out"
  else
    ok
  fi
}

# finish NAME: the summary line; the script's exit status.
finish() {
  echo "$1: $((checks - fails))/$checks checks passed"
  [ "$fails" -eq 0 ]
}
