"""The experiment record (docs/using.md, "strata note", "strata diff"):
context.json's author, notes.json, and `strata diff` on two real short runs
that differ in train.lr only.

The runs use configs/test.yml (its bundle is the one most tests use: no
export, no compile of its own; about half a second each). What a train.lr
change does to the losses, observed: step 1's loss is computed before any
update, so it is bitwise equal in both runs; step 1's update uses lr x 1/10
(warmup) of each run's lr, so step 2's loss is the first that differs, and
by far more than 1e-6 relative (about 1e-3 here). The tests assert exactly
that, checked against metrics.jsonl read here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRATA = ROOT / "build" / "strata"
STEPS = 4
COMMON = ["configs/test.yml", f"train.steps={STEPS}", "train.eval_every=2", "ckpt.every=0", "obs.tensorboard=false"]
# git's own command-scope config (it overrides every config file), so the
# author "from git" is known whatever the machine's git identity is.
GIT_IDENTITY = {"GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "user.name", "GIT_CONFIG_VALUE_0": "Grace Git",
                "GIT_CONFIG_KEY_1": "user.email", "GIT_CONFIG_VALUE_1": "grace@example.org"}


def _strata(*args: str, code: int = 0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if not os.access(STRATA, os.X_OK):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    r = subprocess.run([str(STRATA), *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, **(env or {})})
    assert r.returncode == code, f"exit {r.returncode}, wanted {code}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("diff")
    a, b = d / "run_a", d / "run_b"
    _strata("train", *COMMON, "obs.author=Ada Override", f"run.dir={a}")
    _strata("train", *COMMON, "train.lr=0.001", f"run.dir={b}", env=GIT_IDENTITY)
    return a, b


def _losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "loss" in m:
            out[m["step"]] = m["loss"]
    return out


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def test_author_from_override_and_from_git(runs: tuple[Path, Path]) -> None:
    a, b = (json.loads((r / "context.json").read_text()) for r in runs)
    assert (a["author"], a["author_source"]) == ("Ada Override", "config")
    assert (b["author"], b["author_source"]) == ("Grace Git <grace@example.org>", "git")


def test_diff_json_finds_lr_and_the_first_differing_step(runs: tuple[Path, Path]) -> None:
    a, b = runs
    la, lb = _losses(a), _losses(b)
    assert sorted(la) == sorted(lb) == list(range(1, STEPS + 1))
    # What the diff must find, computed here from the logs.
    assert _bits(la[1]) == _bits(lb[1])
    assert _bits(la[2]) != _bits(lb[2])
    assert abs(la[2] - lb[2]) / max(abs(la[2]), abs(lb[2])) > 1e-6

    j = json.loads(_strata("diff", str(a), str(b), "--json").stdout)
    assert j["config"]["differs"] == [{"key": "train.lr", "a": 0.003, "b": 0.001}]
    outside = {d["key"] for d in j["config"]["differs_outside_experiment"]}
    assert outside == {"run.dir", "obs.author"}
    ctx = {d["key"]: (d.get("a"), d.get("b")) for d in j["context"]["differs"]}
    assert ctx["author"] == ("Ada Override", "Grace Git <grace@example.org>")
    assert ctx["author_source"] == ("config", "git")
    assert "config_hash" in ctx and "run_id" in ctx
    assert "git_commit" not in ctx and "bundle_key" not in ctx  # the same source and programs
    loss = j["loss"]
    assert loss["common_steps"] == STEPS and loss["rtol"] == 1e-6
    assert loss["first_bitwise"]["step"] == 2 and loss["first_over_rtol"]["step"] == 2
    assert (loss["first_bitwise"]["a"], loss["first_bitwise"]["b"]) == (la[2], lb[2])
    assert [s["step"] for s in j["samples"]] == list(range(1, STEPS + 1))
    assert [e["step"] for e in j["evals"]] == [2, 4]
    assert j["throughput"]["median_tokens_per_s"][0] > 0

    # The threshold separates: above the largest difference nothing is over it.
    big = loss["max_rel"]["rel"] * 1.01
    j2 = json.loads(_strata("diff", str(a), str(b), "--json", f"--rtol={big}").stdout)
    assert j2["loss"]["first_over_rtol"] is None and j2["loss"]["first_bitwise"]["step"] == 2

    # A run against itself: nothing differs.
    same = json.loads(_strata("diff", str(a), str(a), "--json").stdout)
    assert same["config"]["differs"] == [] and same["config"]["differs_outside_experiment"] == []
    assert same["context"]["differs"] == []
    assert same["loss"]["first_bitwise"] is None and same["loss"]["first_over_rtol"] is None


def test_diff_text_lists_train_lr_first(runs: tuple[Path, Path]) -> None:
    a, b = runs
    out = _strata("diff", str(a), str(b)).stdout
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("config (the experiment"))
    assert "1 key differs" in lines[head]
    # The section's first row after its column header is train.lr with both values.
    assert lines[head + 1].split() == ["key", "A", "B"]
    assert lines[head + 2].split() == ["train.lr", "0.003", "0.001"]
    assert head < out.index("context (context.json)") < out.index("loss: 4 steps in both runs")
    assert "first step whose loss differs (bitwise): step 2 (" in out
    assert "first step whose relative difference exceeds 1e-6: step 2 (" in out
    assert re.search(r"^\s+2\*\s", out, re.M), out  # the sampled table marks it


def test_diff_html_has_both_curves_and_no_script(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    page = tmp_path / "diff.html"
    r = _strata("diff", str(a), str(b), "--html", str(page))
    assert f"html: {page}" in r.stdout
    html = page.read_text(encoding="utf-8")
    low = html.lower()
    assert "<script" not in low and "<img" not in low and "<link" not in low and "url(" not in low
    assert not re.search(r"(https?|ftp|wss?):", html)
    assert "default-src 'none'" in html
    # train.lr is the first row of the config differences.
    table = html[html.index('id="config-diff"'):]
    assert re.match(r'id="config-diff"><tr><th>key</th><th>A</th><th>B</th></tr>\n<tr><th>train\.lr</th>'
                    r'<td class="ev">0\.003</td><td class="ev">0\.001</td></tr>', table), table[:300]
    # Both runs' loss curves drawn in the loss plot: a non-empty path each.
    svg = html[html.index('id="plot-loss"'):]
    svg = svg[:svg.index("</svg>")]
    assert "A train loss" in svg and "B train loss" in svg
    drawn = re.findall(r'<path[^>]* d="M[^"]+"', svg)
    assert len(drawn) >= 4, svg[:2000]  # train A, train B, eval A, eval B
    for pid in ("plot-loss-rel", "plot-tokens-per-s", "plot-lr", "plot-grad-norm"):
        assert f'id="{pid}"' in html


def test_note_round_trip(runs: tuple[Path, Path], tmp_path: Path) -> None:
    src = runs[1]
    run = tmp_path / "run_b"
    shutil.copytree(src, run)  # the other tests see the run without notes
    _strata("note", str(run), "--hypothesis", "a lower lr <converges> slower", "--author", "Ada")
    _strata("note", str(run), "--", "-5% loss at step 4: as expected")
    _strata("note", str(run), "--conclusion", "confirmed")
    _strata("note", str(run), "--hypothesis", "revised: lr 1e-3 is too low")
    notes = json.loads(_strata("note", str(run), "--json").stdout)
    entries = notes["entries"]
    assert [(e["kind"], e["text"]) for e in entries] == [
        ("hypothesis", "a lower lr <converges> slower"), ("note", "-5% loss at step 4: as expected"),
        ("conclusion", "confirmed"), ("hypothesis", "revised: lr 1e-3 is too low")]
    assert entries[0]["author"] == "Ada"
    assert json.loads((run / "notes.json").read_text()) == notes
    text = _strata("note", str(run)).stdout
    assert "hypothesis:\n" in text and "revised: lr 1e-3 is too low" in text and "entries: 4" in text

    # Shown by diff (the newest hypothesis) and by report (escaped).
    j = json.loads(_strata("diff", str(runs[0]), str(run), "--json").stdout)
    assert j["notes"][0]["hypothesis"] is None
    assert j["notes"][1]["hypothesis"] == "revised: lr 1e-3 is too low" and j["notes"][1]["conclusion"] == "confirmed"
    assert "B hypothesis: revised: lr 1e-3 is too low" in _strata("diff", str(runs[0]), str(run)).stdout
    _strata("report", str(run))
    html = (run / "report.html").read_text(encoding="utf-8")
    assert '<td class="notetext" id="note-hypothesis">revised: lr 1e-3 is too low</td>' in html
    assert "a lower lr &lt;converges&gt; slower" in html

    # Notes written at the same time are all kept (the flock on the run directory).
    procs = [subprocess.Popen([str(STRATA), "note", str(run), f"parallel {i}"], cwd=ROOT, stdout=subprocess.DEVNULL)
             for i in range(8)]
    assert [p.wait(timeout=60) for p in procs] == [0] * 8
    texts = [e["text"] for e in json.loads((run / "notes.json").read_text())["entries"]]
    assert len(texts) == 12 and sorted(texts[4:]) == [f"parallel {i}" for i in range(8)]

    # A notes.json strata cannot read is never overwritten.
    (run / "notes.json").write_text('{"entries": "not a list"}')
    r = _strata("note", str(run), "more", code=2)
    assert "notes.json: 'entries' is missing or not a list" in r.stderr and "move the file aside" in r.stderr
    assert (run / "notes.json").read_text() == '{"entries": "not a list"}'
    _strata("note", str(run), code=2)  # printing refuses it too
    _strata("report", str(run))  # the report says so and goes on
    html = (run / "report.html").read_text(encoding="utf-8")
    assert "notes.json: &#39;entries&#39; is missing or not a list" in html, html[html.index("<h2>Notes</h2>"):][:400]
    r = _strata("note", str(tmp_path), "text", code=2)
    assert "is not a run directory" in r.stderr


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_diff_bad_input_names_the_file(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    # A line cut by a crash in the middle of the log: damaged, exit 2 naming it and its byte.
    cut = _copy(b, tmp_path / "cut")
    lines = (cut / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][:40] + "\n"
    (cut / "metrics.jsonl").write_text("".join(lines))
    r = _strata("diff", str(a), str(cut), code=2)
    assert f"run B: {cut}/metrics.jsonl: 1 damaged line, the first at byte {len(lines[0])} (not JSON)" in r.stderr
    # An incomplete last line (a run being written): left out, said, exit 0.
    torn = _copy(b, tmp_path / "torn")
    with open(torn / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "loss": 1.')
    out = _strata("diff", str(a), str(torn)).stdout
    assert "ends in an incomplete line (the run may be writing it): left out" in out
    # Missing files and folders.
    nometrics = _copy(b, tmp_path / "nometrics")
    (nometrics / "metrics.jsonl").unlink()
    assert f"{nometrics}/metrics.jsonl: missing" in _strata("diff", str(a), str(nometrics), code=2).stderr
    noconfig = _copy(b, tmp_path / "noconfig")
    (noconfig / "config.yaml").unlink()
    assert f"{noconfig}/config.yaml: missing" in _strata("diff", str(noconfig), str(b), code=2).stderr
    assert "run A: /nonexistent/run: not a folder" in _strata("diff", "/nonexistent/run", str(b), code=2).stderr
    badctx = _copy(b, tmp_path / "badctx")
    (badctx / "context.json").write_text("[1, 2")
    assert f"{badctx}/context.json:" in _strata("diff", str(a), str(badctx), code=2).stderr
    # Usage.
    _strata("diff", str(a), code=2)
    _strata("diff", str(a), str(b), "--rtol", "-1", code=2)
    _strata("diff", str(a), str(b), str(b), code=2)


def test_resumed_steps_replace_the_earlier_ones(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """A resume repeats steps from its checkpoint: the diff keeps the newest
    line of each step (the ones the final state came from)."""
    a = runs[0]
    r = _copy(a, tmp_path / "resumed")
    lines = (a / "metrics.jsonl").read_text().splitlines(keepends=True)
    step3: Any = next(json.loads(x) for x in lines if json.loads(x).get("step") == 3 and "loss" in json.loads(x))
    step3["loss"] = 9.0  # the replayed step 3 differs, then step 4 as before
    step4 = next(x for x in lines if json.loads(x).get("step") == 4 and "loss" in json.loads(x))
    with open(r / "metrics.jsonl", "a") as f:
        f.write(json.dumps(step3) + "\n" + step4)
    j = json.loads(_strata("diff", str(a), str(r), "--json").stdout)
    assert j["runs"][1]["steps"] == STEPS and j["runs"][1]["step_lines"] == STEPS + 2
    assert j["loss"]["first_bitwise"]["step"] == 3 and j["loss"]["first_bitwise"]["b"] == 9.0
    assert j["loss"]["max_rel"]["step"] == 3
