"""TensorBoard event files (docs/using.md, "TensorBoard"; issue 16 item 4).

A run writes every metrics.jsonl line as scalars to <run>/tb/ as it trains.
Read back here with TensorBoard's own reader (tensorboard, pinned in
requirements.lock: its record reader checks both CRC-32Cs of every record,
so the framing written in C is checked by an independent implementation):

- the file starts with the version record "brain.Event:2" and is named
  events.out.tfevents.<unix s>.<host>.<pid>;
- the scalars are metrics.jsonl, line for line and in order: every number of
  each line (nested objects as "a/b", the step as the event's step), equal
  to the float32 nearest the line's double (TensorBoard's scalars are
  float32: simple_value), eval and checkpoint lines included; a data-parallel run, so the two-level
  collectives_by_kind objects are in it (nulls, booleans, strings: the C
  test, tests/c/test_tensorboard.c);
- the run is SIGKILLed during step 3 (faults.crash_at_step): what was
  written before is in the file (no user-space buffer lost), and a resume
  adds a second file, the union of the two matching metrics.jsonl;
- TensorBoard's scalar dashboard sees every tag, both through the Python
  loader and through `tensorboard --logdir` itself, whose default data
  server (Rust, tensorboard-data-server) reads fewer encodings: it shows no
  double-tensor scalars, for one;
- obs.tensorboard=false writes no tb/ folder.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2
from tensorboard.util import tensor_util

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")
BASE = ["configs/test.yml", "train.steps=6", "train.eval_every=2", "ckpt.every=2", "ckpt.async=false",
        "parallel.data=2", "runtime.cpu_devices=2", "run.progress=off"]


def run(cmd: list[str], ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if ok and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


def flatten(obj: dict, prefix: str = "") -> list[tuple[str, float]]:
    """The documented mapping: every number, nested keys joined by '/'."""
    out = []
    for k, v in obj.items():
        tag = f"{prefix}/{k}" if prefix else k
        if not prefix and k == "step":
            continue
        if isinstance(v, dict):
            out += flatten(v, tag)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((tag, float(np.float32(v))))  # TensorBoard scalars are float32
    return out


def expected(run_dir) -> list[tuple[int, list[tuple[str, float]]]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(m["step"], flatten(m)) for m in lines]


def tb_files(run_dir) -> list:
    # In the order the runs wrote them: the names (time in seconds, host,
    # pid) do not sort so when a crash and its resume start in the same
    # second and the pids cross a power of ten (9991 then 10000).
    return sorted((run_dir / "tb").iterdir(), key=lambda f: f.stat().st_mtime_ns)


def read_events(path) -> tuple[list, list[tuple[int, list[tuple[str, float]]]]]:
    # The records as written (EventFileLoader would migrate simple_value to tensors).
    events = [event_pb2.Event.FromString(r) for r in RawEventFileLoader(str(path)).Load()]
    got = []
    for ev in events[1:]:
        assert ev.HasField("summary"), ev
        vals = []
        for v in ev.summary.value:
            assert v.WhichOneof("value") == "simple_value", v
            vals.append((v.tag, v.simple_value))
        got.append((ev.step, vals))
    return events, got


@pytest.fixture(scope="module")
def crashed_and_resumed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not os.path.exists(STRATA):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    run_dir = tmp_path_factory.mktemp("tb") / "run"
    r = run([STRATA, "train", *BASE, "faults.crash_at_step=3", f"run.dir={run_dir}"], ok=False)
    assert r.returncode in (-9, 137), (r.returncode, r.stderr)
    files = tb_files(run_dir)
    crashed = {"files": files, "expected": expected(run_dir), "read": [read_events(f) for f in files]}
    run([STRATA, "resume", str(run_dir), "faults.crash_at_step=0"])
    return {"dir": run_dir, "crashed": crashed}


def test_file_name_and_version_record(crashed_and_resumed: dict) -> None:
    files = crashed_and_resumed["crashed"]["files"]
    assert len(files) == 1
    m = re.fullmatch(r"events\.out\.tfevents\.(\d+)\.(.+)\.(\d+)", files[0].name)
    assert m and m.group(2) == socket.gethostname(), files[0].name
    events, _ = crashed_and_resumed["crashed"]["read"][0]
    assert events[0].file_version == "brain.Event:2" and events[0].wall_time > 0
    assert all(abs(e.wall_time - int(m.group(1))) < 600 for e in events)


def test_written_as_it_trains_then_killed(crashed_and_resumed: dict) -> None:
    """SIGKILL during step 3: steps 1 and 2 (eval and checkpoint at 2 too)
    are in the event file as in metrics.jsonl."""
    crashed = crashed_and_resumed["crashed"]
    want = crashed["expected"]
    assert [s for s, _ in want] == [1, 2, 2, 2], want  # step 1, step 2, eval 2, checkpoint 2
    assert crashed["read"][0][1] == want


def test_resume_adds_a_file_and_the_union_matches(crashed_and_resumed: dict) -> None:
    run_dir = crashed_and_resumed["dir"]
    files = tb_files(run_dir)
    assert len(files) == 2 and files[0] == crashed_and_resumed["crashed"]["files"][0]
    got = []
    for f in files:
        events, vals = read_events(f)
        assert events[0].file_version == "brain.Event:2"
        got += vals
    want = expected(run_dir)
    assert [s for s, _ in want if s > 2][0] == 3 and want[-1][0] == 6
    assert got == want
    tags = {t for _, vals in got for t, _ in vals}
    # The list, spelled as metrics.jsonl spells them (not vacuous).
    for t in ["loss", "eval_loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "peak_live_bytes",
              "peak_live_by_category/params", "peak_live_by_category/optimizer",
              "peak_live_by_category_predicted/activations", "recomputes", "waits", "overlap_ratio", "h2d_bytes",
              "collectives", "collectives_by_kind/all_reduce/count", "collectives_by_kind/all_reduce/bytes",
              "comm_wait_s", "ckpt_write_s", "ckpt_bytes"]:
        assert t in tags, (t, sorted(tags))
    assert "step" not in tags


def test_scalar_dashboard_sees_every_tag(crashed_and_resumed: dict) -> None:
    run_dir = crashed_and_resumed["dir"]
    acc = plugin_event_accumulator.EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    scalar_tags = set(acc.PluginTagToContent("scalars"))
    want = expected(run_dir)
    assert scalar_tags == {t for _, vals in want for t, _ in vals}
    evals = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto).item())) for e in acc.Tensors("eval_loss")]
    assert evals == [(s, dict(vals)["eval_loss"]) for s, vals in want if "eval_loss" in dict(vals)]
    assert [e.step for e in acc.Tensors("loss")] == [1, 2, 3, 4, 5, 6]


def test_tensorboard_server_shows_the_scalars(crashed_and_resumed: dict, tmp_path) -> None:
    """`tensorboard --logdir` with its default (Rust) data server, asked
    over HTTP as the dashboard asks: every tag, and eval_loss's points."""
    run_dir = crashed_and_resumed["dir"]
    want = expected(run_dir)
    want_tags = {t for _, vals in want for t, _ in vals}
    log = open(tmp_path / "tensorboard.log", "w")
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "tensorboard"), "--logdir", str(run_dir),
                             "--port", "0", "--load_fast", "true", "--reload_interval", "1"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        base, tags = None, {}
        while time.monotonic() < deadline and set(tags.get("tb", {})) != want_tags:
            time.sleep(1)
            assert proc.poll() is None, (tmp_path / "tensorboard.log").read_text()
            if base is None:
                m = re.search(r"at (http://[^/\s]+/)", (tmp_path / "tensorboard.log").read_text())
                base = m and m.group(1)
                continue
            with urllib.request.urlopen(base + "data/plugin/scalars/tags", timeout=10) as r:
                tags = json.load(r)
        assert set(tags.get("tb", {})) == want_tags, (tags, (tmp_path / "tensorboard.log").read_text())
        q = urllib.parse.urlencode({"run": "tb", "tag": "eval_loss"})
        with urllib.request.urlopen(base + "data/plugin/scalars/scalars?" + q, timeout=10) as r:
            points = [(step, value) for _, step, value in json.load(r)]
        assert points == [(s, dict(vals)["eval_loss"]) for s, vals in want if "eval_loss" in dict(vals)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_off(tmp_path) -> None:
    run_dir = tmp_path / "off"
    run([STRATA, "train", "configs/test.yml", "train.steps=1", "run.progress=off", "obs.tensorboard=false",
         f"run.dir={run_dir}"])
    assert (run_dir / "metrics.jsonl").read_text() and not (run_dir / "tb").exists()
