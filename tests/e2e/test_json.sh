#!/usr/bin/env bash
# test_json.sh — every JSON strata writes is valid JSON for any string a user
# can give it (issue 11, item 12). The run directory, the corpus path and
# the cache folder (config values all three) hold double quotes,
# backslashes, a newline (not the cache) and non-ASCII; a training run (with a trace and checkpoints), a supervised
# run with one crash and restart, `plan --json` and `config --json` then
# write every kind of JSON output (and `analyze --json` reads the run back), and each file and line must parse and
# carry the strings back unchanged. Run from the repository root.
set -uo pipefail

STRATA=$(realpath "${STRATA:-./build/strata}")
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d /tmp/strata-e2e-json-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

source "$(dirname "$0")/lib.sh"

NL=$'\n'
WEIRD="q\"uote b\\ack${NL}line é ü 漢"
# The cache (bundle folder, token files; runtime.cache_dir) under a hostile
# name too; no newline there: the exporter is a Python program given the
# folder as an argument, and that path is not what this test is about.
CACHE="$TMP/cache \"c\" \\ é"
RUN="$TMP/run $WEIRD"
SUP="$TMP/sup $WEIRD"
CORPUS="$TMP/corpus $WEIRD.txt"
head -c 20000 /usr/share/games/fortunes/fortunes >"$CORPUS"

BASE=(configs/test.yml runtime.deterministic=true run.progress=off data.synthetic=false "data.path=$CORPUS" "runtime.cache_dir=$CACHE")

if "$STRATA" train "${BASE[@]}" "run.dir=$RUN" 'trace.steps=[2]' ckpt.every=5 >"$TMP/out" 2>"$TMP/err"; then ok; else
  bad "train exited $?: $(tail -3 "$TMP/err")"
fi
if "$STRATA" run "${BASE[@]}" "run.dir=$SUP" ckpt.every=5 faults.crash_at_step=7 recovery.backoff_s=0.05 >"$TMP/out" 2>"$TMP/err"; then
  ok
else
  bad "strata run exited $?: $(tail -3 "$TMP/err")"
fi
"$STRATA" plan --json "${BASE[@]}" >"$TMP/plan.json" 2>"$TMP/err" || bad "plan --json exited $?: $(tail -3 "$TMP/err")"
"$STRATA" config --json "${BASE[@]}" "run.dir=$RUN" >"$TMP/config.json" 2>"$TMP/err" || bad "config --json exited $?: $(tail -3 "$TMP/err")"
"$STRATA" status --json "$RUN" >"$TMP/status.json" 2>"$TMP/err" || bad "status --json exited $?: $(tail -3 "$TMP/err")"
check "status --json parses and carries the run directory back" "$PY - '$TMP/status.json' '$RUN' <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1], encoding='utf-8'))
assert s['run_dir'] == sys.argv[2] and s['state'] == 'finished', s
PYEOF"

"$STRATA" analyze --json "$RUN" >"$TMP/analyze.json" 2>"$TMP/err" || bad "analyze --json exited $?: $(tail -3 "$TMP/err")"
check "analyze --json parses and carries the run and bundle directories back" "$PY - '$TMP/analyze.json' '$RUN' '$CACHE' <<'PYEOF'
import json, sys
a = json.load(open(sys.argv[1], encoding='utf-8'))
assert a['run_dir'] == sys.argv[2] and a['bundle'].startswith(sys.argv[3]), (a['run_dir'], a['bundle'])
assert a['step']['trace']['files'] == 1 and all('error' not in p for p in a['programs'])
PYEOF"

check "every JSON output parses and carries the strings back" "$PY - '$RUN' '$SUP' '$TMP/plan.json' '$TMP/config.json' '$CORPUS' '$CACHE' <<'PYEOF'
import glob, json, os, struct, sys
run, sup, plan, config, corpus, cache = sys.argv[1:]
parsed = []

def load(path):
    with open(path, encoding='utf-8') as f:
        v = json.load(f)
    parsed.append(path)
    return v

def lines(path):
    with open(path, encoding='utf-8') as f:
        v = [json.loads(l) for l in f]
    parsed.append(path)
    return v

def header(path):  # a safetensors header is JSON too
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        v = json.loads(f.read(n).decode('utf-8'))
    parsed.append(path)
    return v

def walk(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            if name.endswith('.jsonl'):
                out[p] = lines(p)
            elif name.endswith('.json'):
                out[p] = load(p)
            elif name.endswith('.safetensors'):
                out[p] = header(p)
    return out

r = walk(run)
s = walk(sup)
events = r[os.path.join(run, 'events.jsonl')]
init = next(e for e in events if e['event'] == 'init')
assert init['run_dir'] == run, init['run_dir']
assert init['context']['run_id'] == os.path.basename(run)
assert json.load(open(os.path.join(run, 'context.json')))['run_id'] == os.path.basename(run)
bundle = next(e for e in events if e['event'] == 'bundle')
assert bundle['dir'].startswith(cache), bundle['dir']
saved = next(e for e in events if e['event'] == 'saved')
assert saved['path'] == os.path.join(run, 'params.safetensors')
trace = next(e for e in events if e['event'] == 'trace')
assert trace['path'] == os.path.join(run, 'trace', 'step_2.json') and trace['path'] in r
assert len(r[os.path.join(run, 'metrics.jsonl')]) >= 10
manifests = [p for p in r if p.endswith('manifest.json')]
assert len(manifests) >= 2, sorted(r)
for p in manifests:
    m = r[p]
    assert m['config']['data']['path'] == corpus and m['config']['runtime']['cache_dir'] == cache, m['config']
ck = next(e for e in events if e['event'] == 'ckpt_saved')
assert ck['dir'].startswith(os.path.join(run, 'checkpoints')), ck['dir']

rec = s[os.path.join(sup, 'recovery.json')]
assert rec['run_dir'] == sup and rec['restarts'] == 1 and rec['outcome'] == 'completed', rec
sev = s[os.path.join(sup, 'events.jsonl')]
start = next(e for e in sev if e['event'] == 'child_start')
assert sup in start['command'], start
assert any(e['event'] == 'resumed' and e['checkpoint'].startswith(os.path.join(sup, 'checkpoints')) for e in sev)

p = load(plan)
assert p['bundle'].startswith(cache) and p['step']['ops'], p['bundle']
c = load(config)
assert c['data']['path'] == corpus and c['runtime']['cache_dir'] == cache and c['run']['dir'] == run, c['run']
print('  parsed %d JSON files' % len(parsed))
PYEOF"

# The source folder (STRATA_SOURCE_DIR, where context.json's git facts come
# from) under a name with a single quote and a space: git used to run
# through a shell with the folder in single quotes, so such a tree lost its
# commit. A git repository of its own, so the commit to expect is known.
SRC="$TMP/src 'q' é"
mkdir -p "$SRC"
for d in configs python .venv; do ln -s "$PWD/$d" "$SRC/$d"; done
git -C "$SRC" init -q && git -C "$SRC" -c user.email=t@t -c user.name=t commit -q --allow-empty -m t
WANT=$(git -C "$SRC" rev-parse HEAD)
if STRATA_SOURCE_DIR="$SRC" "$STRATA" train "${BASE[@]}" "run.dir=$TMP/srcrun" train.steps=2 >"$TMP/out" 2>"$TMP/err"; then
  check "context.json names the commit of a source folder whose name holds a quote" \
    "$PY -c 'import json,sys; c=json.load(open(sys.argv[1])); sys.exit(0 if c[\"git_commit\"]==sys.argv[2] and c[\"git_dirty\"] is False else 1)' '$TMP/srcrun/context.json' '$WANT'"
else
  bad "train with a quoted STRATA_SOURCE_DIR exited $?: $(tail -3 "$TMP/err")"
fi

finish test_json
