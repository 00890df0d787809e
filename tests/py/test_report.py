"""strata report (docs/using.md, "strata report"): a real small run rendered in
headless Chromium, and hostile run directories.

The browser check injects one script in front of the report's own
Content-Security-Policy (so the report stays script-free and its policy
stays in force for everything after it): it records uncaught errors,
failed loads, CSP violations and console.error/warn, then, on load, every
<svg class="plot">: how many <path>s have a non-empty `d` and the largest
rendered bounding box among them. Chromium's own console log (stderr) must
be empty too. A deliberately broken copy of the report must fail the same
check, so the check itself can fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRATA = ROOT / "build" / "strata"

PLOTS = ["plot-loss-steps", "plot-loss-tokens", "plot-lr", "plot-grad-norm", "plot-tokens-per-s", "plot-step-time",
         "plot-memory", "plot-events"]

CHECKER = """<script>
window.__errs = [];
addEventListener('error', e => __errs.push('error: ' + (e.message || (e.target && (e.target.src || e.target.href)) || 'load')), true);
addEventListener('securitypolicyviolation', e => __errs.push('csp: ' + e.blockedURI + ' ' + e.violatedDirective));
for (const k of ['error', 'warn']) {
  const f = console[k];
  console[k] = (...a) => { __errs.push(k + ': ' + a.join(' ')); f.apply(console, a); };
}
addEventListener('load', () => {
  const plots = [...document.querySelectorAll('svg.plot')].map(svg => {
    const all = [...svg.querySelectorAll('path')];
    const drawn = all.filter(p => (p.getAttribute('d') || '').trim().length > 0);
    let box = 0;
    for (const p of drawn) { const b = p.getBBox(); box = Math.max(box, b.width + b.height); }
    return {id: svg.id, empty: svg.getAttribute('data-empty') === '1', paths: all.length, drawn: drawn.length, box: box,
            width: svg.getBoundingClientRect().width};
  });
  const pre = document.createElement('pre');
  pre.id = 'selfcheck';
  pre.textContent = 'SELF' + 'CHECK' + JSON.stringify({errors: __errs, plots: plots}) + 'SELF' + 'CHECK';
  document.body.appendChild(pre);
});
</script>
"""


def _chromium() -> str:
    exe = shutil.which("chromium")
    if not exe:
        # Not a skip: scripts/setup.sh installs it, and a skip would hide the browser check.
        pytest.fail("chromium is missing: scripts/setup.sh installs it (Debian package chromium)")
    return exe


def _strata(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if not os.access(STRATA, os.X_OK):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    r = subprocess.run([str(STRATA), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def browser_check(html_path: Path, work: Path) -> dict[str, Any]:
    """Renders a copy of |html_path| with the checker injected; returns its
    findings plus 'console': Chromium's console log lines."""
    html = html_path.read_text(encoding="utf-8")
    assert "<head>" in html
    probe = work / ("probe-" + html_path.name)
    probe.write_text(html.replace("<head>", "<head>\n" + CHECKER, 1), encoding="utf-8")
    r = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                        "--virtual-time-budget=3000", "--window-size=1280,4000", "--dump-dom", probe.as_uri()],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="selfcheck">SELFCHECK(.*?)SELFCHECK</pre>', r.stdout, re.S)
    assert m, f"the checker did not run: {r.stdout[-2000:]} {r.stderr[-2000:]}"
    out = json.loads(m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&"))
    out["console"] = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    return out


def problems(found: dict[str, Any], want: list[str]) -> list[str]:
    """What is wrong with a page: errors, console lines, missing or empty plots."""
    bad = [f"page error: {e}" for e in found["errors"]] + [f"console: {c}" for c in found["console"]]
    by_id = {p["id"]: p for p in found["plots"]}
    for pid in want:
        p = by_id.get(pid)
        if p is None:
            bad.append(f"{pid}: missing")
        elif p["empty"] or p["drawn"] == 0 or p["drawn"] < p["paths"] or p["box"] <= 0 or p["width"] <= 0:
            bad.append(f"{pid}: empty or undrawn plot {p}")
    return bad


def assert_offline(html: str) -> None:
    """Nothing in the page refers to the network: no URL scheme, no
    protocol-relative src/href, no @import or url()."""
    assert not re.search(r"(https?|ftp|wss?):", html, re.I), re.search(r".{40}(https?|ftp|wss?):.{40}", html, re.I)
    assert not re.search(r"""(src|href|xlink:href|action)\s*=\s*["']?//""", html, re.I)
    assert not re.search(r"(@import|url\()", html, re.I)
    assert "<script" not in html.lower() and "<img" not in html.lower() and "<link" not in html.lower()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("report") / "run"
    # configs/test.yml's model on real text: its bundle is the one most other
    # tests use, so the run costs no export and no compile of its own (the
    # report reads metrics, events and checkpoints, whatever the model).
    _strata("train", "configs/test.yml", "data.synthetic=false", "data.path=/usr/share/games/fortunes",
            "train.steps=12", "train.eval_every=4", "ckpt.every=6", f"run.dir={d}")
    return d


def test_report_renders_in_chromium(run_dir: Path, tmp_path: Path) -> None:
    (run_dir / "sample.txt").write_text("Once upon a <time> & \"place\"\n", encoding="utf-8")
    r = _strata("report", str(run_dir))
    out = run_dir / "report.html"
    assert r.stdout.startswith(f"report: {out} (12 steps, 3 evaluations, ")
    html = out.read_text(encoding="utf-8")
    assert_offline(html)
    for pid in PLOTS:
        assert f'id="{pid}"' in html
    # The sections, and the sample escaped.
    for h in ("Summary", "Plots", "Sample", "Checkpoints", "Context", "Resolved config", "Events"):
        assert f"<h2>{h}</h2>" in html
    assert "Once upon a &lt;time&gt; &amp; &quot;place&quot;" in html
    assert "step_12 (LATEST)" in html and "step_6" in html
    assert "communication wait" not in html  # one device: no comm_wait_s
    assert "config_hash" in html and "git_commit" in html and "train:\n  steps: 12" in html
    found = browser_check(out, tmp_path)
    assert problems(found, PLOTS) == []
    assert len(found["plots"]) == len(PLOTS)
    # And a picture, for a person (the file lands in the test's tmp dir).
    shot = tmp_path / "report.png"
    subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1280,4000", out.as_uri()], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 20000


def test_browser_check_fails_on_a_broken_report(run_dir: Path, tmp_path: Path) -> None:
    """The check is not vacuous: a plot whose path is garbage, a plot whose
    paths are empty, and a network load are each reported."""
    out = tmp_path / "broken.html"
    _strata("report", str(run_dir), "--out", str(out))
    html = out.read_text(encoding="utf-8")
    lr = html.index('id="plot-lr"')
    gn = html.index('id="plot-grad-norm"')
    head, lr_part, rest = html[:lr], html[lr:gn], html[gn:]
    lr_part = re.sub(r' d="[^"]*"', ' d="M NaN 1 L"', lr_part)
    end = rest.index("</svg>")
    rest = re.sub(r' d="[^"]*"', ' d=""', rest[:end]) + rest[end:]
    broken = (head + lr_part + rest).replace("</body>", '<img src="http://127.0.0.1:9/x.png"></body>')
    out.write_text(broken, encoding="utf-8")
    bad = problems(browser_check(out, tmp_path), PLOTS)
    assert any(b.startswith("plot-lr:") for b in bad), bad
    assert any(b.startswith("plot-grad-norm:") for b in bad), bad
    assert any("csp" in b or "127.0.0.1" in b for b in bad), bad
    assert any(b.startswith("console:") for b in bad), bad
    assert not any(b.startswith(("plot-loss-steps", "plot-memory")) for b in bad), bad


def _line(obj: Any) -> str:
    return json.dumps(obj) + "\n"


def test_hostile_run_directory(tmp_path: Path) -> None:
    """Bad, torn, overlong and non-object lines are skipped and counted;
    markup and bytes that are not UTF-8 in any file are escaped."""
    d = tmp_path / "hostile"
    d.mkdir()
    evil = "</pre><script>alert(1)</script><img src=x onerror=alert(2)>"
    with open(d / "metrics.jsonl", "wb") as f:
        f.write(_line({"step": 1, "loss": 3.0, "lr": 0.1, "tokens": 10, "step_time_s": 0.5, "wait_s": 0.4}).encode())
        f.write(b"not json at all\n")
        f.write(b"[1, 2, 3]\n")
        f.write(b'{"step": 2, "loss": ' + b"1" * (2 << 20) + b"}\n")  # longer than the line bound
        f.write(_line({"step": 2, "loss": None, "lr": 0.1, "tokens": 10}).encode())  # a NaN loss
        f.write(_line({"step": 3, "loss": 2.0, "lr": "x", "tokens": -5, "peak_live_by_category": {evil: 5}}).encode())
        f.write(_line({"step": 3, "eval_loss": 2.5}).encode())
        f.write(b'{"step": 4, "loss": 1.')  # torn
    with open(d / "events.jsonl", "wb") as f:
        f.write(_line({"time": 1e9, "event": "init"}).encode())
        f.write(_line({"time": 1e9 + 1, "event": "failed", "error": evil}).encode())
        f.write(_line({"time": "soon", "event": evil}).encode())
    (d / "config.yaml").write_bytes(b"model: " + evil.encode() + b"\nbad: \xff\xfe\xc0\x80 \x00 \x1b[31m\n")
    (d / "sample.txt").write_bytes(evil.encode() + b"\xed\xa0\x80")
    (d / "context.json").write_text(json.dumps({"run_id": evil, "devices": [{"kind": evil}]}))
    (d / "checkpoints" / "step_2").mkdir(parents=True)
    (d / "checkpoints" / "step_2" / "manifest.json").write_text("{")
    (d / "checkpoints" / "LATEST").write_text("step_2")
    r = _strata("report", str(d))
    assert "3 steps, 1 evaluations, 3 events, 3 bad log lines skipped" in r.stdout, r.stdout
    raw = (d / "report.html").read_bytes()
    html = raw.decode("utf-8")  # valid UTF-8 whatever the input
    assert "<script" not in html and "<img" not in html and "onerror=alert" not in html.replace("onerror=alert(2)&gt;", "")
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 5
    assert "\x00" not in html and "\x1b" not in html and "\ufffd" in html
    assert "3 bad lines skipped (the first at byte" in html
    assert "ends in an incomplete line" in html
    assert "<tr><th>non-finite loss</th><td>1 step (the first at step 2)" in html
    assert "<tr><th>state</th><td>running, or ended without a final event</td></tr>" in html  # the last event is not final
    assert "<tr><th>failure</th><td>&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;</td>" in html
    assert "invalid JSON" in html  # the checkpoint's manifest
    assert_offline(html)


def test_single_step_and_empty_runs(tmp_path: Path) -> None:
    """One step: every step plot still has a path (a dot). No metrics: the
    page says "no data" and the command still succeeds."""
    d = tmp_path / "one"
    d.mkdir()
    (d / "metrics.jsonl").write_text(_line({"step": 1, "loss": 3.0, "lr": 0.1, "grad_norm": 1.0, "tokens": 8,
                                            "step_time_s": 0.5, "tokens_per_s": 16.0, "wait_s": 0.4,
                                            "peak_live_bytes": 100, "peak_live_bytes_predicted": 100,
                                            "peak_live_by_category": {"params": 60, "activations": 40},
                                            "comm_wait_s": 0.1}))
    _strata("report", str(d))
    html = (d / "report.html").read_text(encoding="utf-8")
    for pid in ["plot-loss-steps", "plot-lr", "plot-grad-norm", "plot-tokens-per-s", "plot-step-time", "plot-memory"]:
        svg = html[html.index(f'id="{pid}"'):]
        svg = svg[:svg.index("</svg>")]
        assert re.search(r' d="M[-0-9. ]', svg), pid
        assert "data-empty" not in svg and "nan" not in svg.lower(), pid
    assert "no sample" in html and "no checkpoints" in html
    assert ">communication wait</text>" in html  # a mesh's comm_wait_s gets its line
    e = tmp_path / "empty"
    e.mkdir()
    (e / "events.jsonl").write_text("")
    _strata("report", str(e))
    html = (e / "report.html").read_text(encoding="utf-8")
    assert html.count('data-empty="1"') == len(PLOTS)
    r = _strata("report", str(tmp_path / "nope"), check=False)
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = _strata("report", str(tmp_path), check=False)
    assert r.returncode == 2 and "neither metrics.jsonl nor events.jsonl" in r.stderr
    r = _strata("report", check=False)
    assert r.returncode == 2 and "usage: strata report RUN_DIR [--out FILE]" in r.stderr


def test_resumed_run_tokens(tmp_path: Path) -> None:
    """Steps 1-5, then a resume from step 3's checkpoint repeats 4 and 5 and
    goes on to 6: tokens restart from step x tokens per step, and the eval
    after step 6 sits at 6 x 100 tokens."""
    d = tmp_path / "resumed"
    d.mkdir()
    lines = [{"step": s, "loss": 1.0, "tokens": 100} for s in (1, 2, 3, 4, 5, 4, 5, 6)] + [{"step": 6, "eval_loss": 0.9}]
    (d / "metrics.jsonl").write_text("".join(_line(x) for x in lines))
    _strata("report", str(d))
    html = (d / "report.html").read_text(encoding="utf-8")
    assert "8 step lines, last step 6, 600 tokens" in html
    svg = html[html.index('id="plot-loss-tokens"'):]
    svg = svg[:svg.index("</svg>")]
    # The eval loss is a single point: a dot at the right edge, where the train line ends.
    paths = re.findall(r' d="([^"]*)"', svg)
    assert len(paths) == 2 and paths[1].startswith("M") and " a2.5" in paths[1]
    assert paths[0].split(" L")[-1].split()[0] == paths[1][1:].split()[0]


def test_long_run_is_thinned(tmp_path: Path) -> None:
    """100k step lines: at most 2048 + 1 points per series, the last step kept."""
    d = tmp_path / "long"
    d.mkdir()
    line = '{"step": %d, "loss": %f, "lr": 0.001, "tokens": 4, "step_time_s": 0.01, "wait_s": 0.005}\n'
    (d / "metrics.jsonl").write_text("".join(line % (i, 5.0 / i) for i in range(1, 100001)))
    r = _strata("report", str(d))
    assert "100000 steps" in r.stdout
    html = (d / "report.html").read_text(encoding="utf-8")
    svg = html[html.index('id="plot-loss-steps"'):]
    d_attr = re.search(r' d="([^"]*)"', svg[:svg.index("</svg>")]).group(1)
    assert 1000 < d_attr.count("L") + 1 <= 2049
    assert "The plots show" in html and "last step 100000, 400000 tokens" in html
