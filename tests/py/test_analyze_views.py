"""`strata analyze` beside its table (issue 17, items 4 to 6): --dot
rendered by Graphviz, --diff between two bundles, and the compile-contract
lint (tests/lint/: one hazard a program, the exact findings expected in
tests/lint/expected.json; and the bundle-level checks, at export/train time
too)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from typing import Any

import pytest
from conftest import ROOT

STRATA = os.path.join(ROOT, "build", "strata")
LINT = os.path.join(ROOT, "tests", "lint")


def _strata(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STRATA, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def _json(*args: str, env: dict[str, str] | None = None, rc: int = 0) -> Any:
    r = _strata(*args, "--json", env=env)
    assert r.returncode == rc, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: Any) -> str:
    d = str(tmp_path_factory.mktemp("views") / "bundle")
    r = _strata("export", "configs/test.yml", f"bundle.dir={d}")
    assert r.returncode == 0, r.stderr
    return d


def _svg_counts(dot_text: str) -> tuple[int, int]:
    r = subprocess.run(["dot", "-Tsvg"], input=dot_text, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.count('class="node"'), r.stdout.count('class="edge"')


# ------------------------------------------------------------------- --dot

def test_dot_of_a_program_renders(bundle: str) -> None:
    r = _strata("analyze", bundle, "--dot=head_loss")
    assert r.returncode == 0, r.stderr
    nodes = re.findall(r"^  n(\d+) \[label=\"([a-z_]+)", r.stdout, re.M)
    edges = re.findall(r"^  n\d+ -> n\d+;$", r.stdout, re.M)
    assert _svg_counts(r.stdout) == (len(nodes), len(edges))
    a = {p["name"]: p for p in _json("analyze", bundle)["programs"]}["head_loss"]
    kinds = [k for _, k in nodes]
    assert kinds.count("arg") == a["args"]
    assert kinds.count("dot_general") == a["ops"]["dot"]
    assert kinds.count("return") == 1
    # Every op but the arguments uses something; the return uses the results.
    assert len(edges) >= len(nodes) - a["args"]


def test_dot_marks_collectives() -> None:
    r = _strata("analyze", os.path.join(LINT, "clean_collective.mlir"), "--dot")
    assert r.returncode == 0, r.stderr
    # 2 args, dot, add, all_reduce, return; add uses %0 twice: one edge
    assert _svg_counts(r.stdout) == (6, 5)
    assert re.search(r'\[label="all_reduce %2\\ntensor<4x4xf32>", shape=hexagon', r.stdout), r.stdout


def test_dot_of_the_step_plan(tmp_path: Any) -> None:
    run = str(tmp_path / "run")
    r = _strata("train", "configs/test.yml", "train.steps=1", "run.progress=off", f"run.dir={run}")
    assert r.returncode == 0, r.stderr
    r = _strata("analyze", run, "--dot")
    assert r.returncode == 0, r.stderr
    launches = sum(p.get("launches_per_step", 0) for p in _json("analyze", run)["programs"])
    ops = re.findall(r"^  op\d+ \[label=", r.stdout, re.M)
    assert len(ops) == launches
    assert "  host [label=" in r.stdout and "  read [label=" in r.stdout
    edges = re.findall(r"^  \S+ -> \S+ \[label=", r.stdout, re.M)
    assert _svg_counts(r.stdout) == (launches + 2, len(edges))
    # The activations flow forward: embed_fwd of microbatch 0 hands x[0] to layer 0's forward.
    ids = dict(re.findall(r'^  (op\d+) \[label="([^"]*)"', r.stdout, re.M))
    first = {v: k for k, v in reversed(list(ids.items()))}
    assert f'  {first["embed_fwd\\nm=0"]} -> {first["block_fwd_res\\nl=0 m=0"]} [label="x[0]"' in r.stdout


def test_dot_of_a_bundle_needs_a_program(bundle: str) -> None:
    r = _strata("analyze", bundle, "--dot")
    assert r.returncode == 2 and "a bundle has no step plan" in r.stderr, r.stderr
    r = _strata("analyze", bundle, "--dot=nope")
    assert r.returncode == 2 and "has no such program" in r.stderr, r.stderr


# ------------------------------------------------------------------ --lint

def test_lint_finds_exactly_the_expected_hazards() -> None:
    with open(os.path.join(LINT, "expected.json"), encoding="utf-8") as f:
        expected = json.load(f)
    files = sorted(f for f in os.listdir(LINT) if f.endswith(".mlir"))
    assert files == sorted(expected)
    for name in files:
        want = expected[name]
        rc = 4 if any(w[0] == "error" for w in want) else 0
        got = _json("analyze", os.path.join(LINT, name), "--lint", rc=rc)
        assert [[x["severity"], x["kind"], x["line"], x["op"]] for x in got["findings"]] == want, name
        assert all(x["program"] == name for x in got["findings"])


def test_a_clean_bundle_lints_clean(bundle: str) -> None:
    got = _json("analyze", bundle, "--lint")
    assert got["errors"] == 0 and got["warnings"] == 0 and got["findings"] == []


def _set_program(b: str, name: str, text: str | None = None, **entry: Any) -> None:
    """Edits a copied bundle: a program's text (and sha256) or a new program entry."""
    mp = os.path.join(b, "manifest.json")
    with open(mp, encoding="utf-8") as f:
        m = json.load(f)
    progs = {p["name"]: p for p in m["programs"]}
    if name not in progs:
        m["programs"].append({**progs[entry.pop("like")], "name": name, "file": f"programs/{name}.mlir"})
        progs = {p["name"]: p for p in m["programs"]}
    if text is not None:
        with open(os.path.join(b, progs[name]["file"]), "w", encoding="utf-8") as f:
            f.write(text)
        progs[name]["sha256"] = hashlib.sha256(text.encode()).hexdigest()
    for k, v in entry.items():
        if k == "layer_fwd":
            m["layers"][v]["programs"]["fwd"] = name
    with open(mp, "w", encoding="utf-8") as f:
        json.dump(m, f)


def test_train_stops_on_a_lint_error_naming_program_and_op(bundle: str, tmp_path: Any) -> None:
    b = str(tmp_path / "b")
    shutil.copytree(bundle, b)
    with open(os.path.join(b, "programs", "embed_fwd.mlir"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    at = next(i for i, line in enumerate(lines) if "func.func public @main(" in line)
    arg0 = re.search(r"%arg0: (tensor<[^>]*>)", lines[at]).group(1)
    lines.insert(at + 1, f"    %cb = stablehlo.custom_call @xla_ffi_python_cpu_callback(%arg0) "
                         f"{{has_side_effect = true}} : ({arg0}) -> {arg0}")
    _set_program(b, "embed_fwd", "\n".join(lines))
    r = _strata("train", "configs/test.yml", "train.steps=1", "run.progress=off", f"bundle.dir={b}",
                f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 4, r.stderr
    assert (f"lint: program 'embed_fwd', line {at + 2}, op stablehlo.custom_call: host_callback" in r.stderr), r.stderr


def test_per_layer_programs_are_a_warning_in_the_bundle_event(bundle: str, tmp_path: Any) -> None:
    b = str(tmp_path / "b")
    shutil.copytree(bundle, b)
    with open(os.path.join(b, "programs", "block_fwd.mlir"), encoding="utf-8") as f:
        text = f.read()
    _set_program(b, "block_fwd_l1", text, like="block_fwd", layer_fwd=1)
    got = _json("analyze", b, "--lint")
    assert [(x["severity"], x["kind"], x["program"]) for x in got["findings"]] == \
        [("warning", "per_layer_compile", "layers")]
    assert "block_fwd at layer 0 and block_fwd_l1 at layer 1 (identical text)" in got["findings"][0]["message"]
    run = str(tmp_path / "run")
    r = _strata("train", "configs/test.yml", "train.steps=1", "run.progress=off", f"bundle.dir={b}", f"run.dir={run}")
    assert r.returncode == 0, r.stderr
    with open(os.path.join(run, "events.jsonl"), encoding="utf-8") as f:
        ev = next(e for e in map(json.loads, f) if e["event"] == "bundle")
    assert [x["kind"] for x in ev["lint"]] == ["per_layer_compile"]


def test_signature_changed_against_the_same_key(tmp_path: Any) -> None:
    env = {"STRATA_CACHE_DIR": str(tmp_path / "cache")}
    r = _strata("export", "configs/test.yml", env=env)
    assert r.returncode == 0, r.stderr
    (key,) = [k for k in os.listdir(tmp_path / "cache" / "bundles") if not k.endswith((".log", ".lock"))]
    cached = str(tmp_path / "cache" / "bundles" / key)
    handed = str(tmp_path / "handed")
    shutil.copytree(cached, handed)
    mp = os.path.join(handed, "manifest.json")
    with open(mp, encoding="utf-8") as f:
        m = json.load(f)
    p = next(p for p in m["programs"] if p["name"] == "sqnorm_head")
    p["outputs"][0]["shape"] = [1]
    with open(mp, "w", encoding="utf-8") as f:
        json.dump(m, f)
    got = _json("analyze", handed, "--lint", env=env, rc=4)
    assert [(x["severity"], x["kind"], x["program"]) for x in got["findings"]] == \
        [("error", "signature_changed", "sqnorm_head")]
    assert _json("analyze", cached, "--lint", env=env)["findings"] == []


# ------------------------------------------------------------------ --diff

def test_diff_of_two_bundles(bundle: str, tmp_path: Any) -> None:
    wider = str(tmp_path / "wider")
    r = _strata("export", "configs/test.yml", "model.d_ff=128", f"bundle.dir={wider}")
    assert r.returncode == 0, r.stderr
    d = _json("analyze", "--diff", bundle, wider)
    assert d["added"] == [] and d["removed"] == [] and not d["same_key"]
    changed = {c["name"]: c for c in d["changed"]}
    # d_ff is inside the block only: its programs change, the embedding's and head's do not.
    assert set(changed) == {"block_init", "block_fwd", "block_bwd", "block_fwd_res", "block_bwd_res",
                            "accum_block", "sqnorm_block", "adamw_block", "adamw_stats_block",
                            "block_prefill", "block_decode"}
    a = {p["name"]: p for p in _json("analyze", bundle)["programs"]}
    b = {p["name"]: p for p in _json("analyze", wider)["programs"]}
    assert d["unchanged"] == len(a) - len(changed)
    for name, c in changed.items():
        assert c["text_changed"] and c["signature_changed"], name
        for k in ("flops", "arg_bytes", "result_bytes", "bytes_accessed", "dot_flops"):
            if a[name][k] != b[name][k]:
                assert c[k] == [a[name][k], b[name][k]], (name, k)
            else:
                assert k not in c, (name, k)
        for k, v in c["ops"].items():
            assert v == [a[name]["ops"][k], b[name]["ops"][k]], (name, k)
    assert changed["block_fwd"]["dot_flops"][1] > changed["block_fwd"]["dot_flops"][0]
    text = _strata("analyze", "--diff", bundle, wider)
    assert text.returncode == 0 and "  changed  block_fwd (text) (signature)" in text.stdout
    assert re.search(r"^    FLOPs +\d+ -> [\d.e+]+ \(\+\d+\.\d%\)$", text.stdout, re.M), text.stdout

    # A program more on one side: added one way, removed the other.
    more = str(tmp_path / "more")
    shutil.copytree(bundle, more)
    with open(os.path.join(more, "programs", "block_fwd.mlir"), encoding="utf-8") as f:
        _set_program(more, "block_fwd_l1", f.read(), like="block_fwd")
    d = _json("analyze", "--diff", bundle, more)
    assert (d["added"], d["removed"], d["changed"], d["same_key"]) == (["block_fwd_l1"], [], [], True)
    d = _json("analyze", "--diff", more, bundle)
    assert (d["added"], d["removed"]) == ([], ["block_fwd_l1"])


# ------------------------------------------------- what XLA did (item 7)

@pytest.mark.long
def test_optimized_hlo_fusions(tmp_path: Any) -> None:
    """runtime.keep_optimized_hlo keeps XLA's optimized program beside each
    executable cache entry; analyze reads its fusions per program."""
    env = {"STRATA_CACHE_DIR": str(tmp_path / "cache")}
    run = str(tmp_path / "run")
    r = _strata("train", "configs/test.yml", "train.steps=1", "run.progress=off", "runtime.keep_optimized_hlo=true",
                f"run.dir={run}", env=env)
    assert r.returncode == 0, r.stderr
    exe = tmp_path / "cache" / "executables"
    metas = {}
    for f in os.listdir(exe):
        if f.endswith(".hlo.json"):
            with open(exe / f, encoding="utf-8") as fh:
                m = json.load(fh)
            assert m["format"] in ("hlo", "hlo_with_config") and os.path.getsize(exe / f[:-5]) == m["bytes"]
            metas.setdefault(m["source_sha256"], []).append(exe / f[:-5])
    a = _json("analyze", run, env=env)
    with open(os.path.join(a["bundle"], "manifest.json"), encoding="utf-8") as f:
        sha = {p["name"]: p["sha256"] for p in json.load(f)["programs"]}
    launched = [p for p in a["programs"] if p.get("launches_per_step")]
    assert launched
    for p in launched:
        x = p["xla"]
        (hlo,) = metas[sha[p["name"]]]
        with open(hlo, "rb") as fh:
            raw = fh.read()
        # Each fusion instruction carries opcode "fusion" (field 2, 6 bytes) once.
        assert x["fusions"] == raw.count(b"\x12\x06fusion"), p["name"]
        assert x["fusions"] >= 1 and 0 < x["entry_instructions"] <= x["instructions"], p["name"]
        ops = [f["ops"] for f in x["largest_fusions"]]
        assert ops == sorted(ops, reverse=True) and len(ops) == min(5, x["fusions"]), p["name"]
    text = _strata("analyze", run, env=env)
    assert re.search(r"^xla: \d+ programs kept; most fusions: \S+ \d+ \(largest ", text.stdout, re.M), text.stdout
    # Without the key nothing is kept, and analyze says how to keep it.
    run2 = str(tmp_path / "run2")
    env2 = {"STRATA_CACHE_DIR": str(tmp_path / "cache2")}
    # The same bundle (what is tested is the executable cache, which starts
    # empty): no second export.
    shutil.copytree(tmp_path / "cache" / "bundles", tmp_path / "cache2" / "bundles")
    r = _strata("train", "configs/test.yml", "train.steps=1", "run.progress=off", f"run.dir={run2}", env=env2)
    assert r.returncode == 0, r.stderr
    assert not [f for f in os.listdir(tmp_path / "cache2" / "executables") if ".hlo" in f]
    assert "xla: no optimized program kept (runtime.keep_optimized_hlo=true keeps them)" in \
        _strata("analyze", run2, env=env2).stdout
