"""The data contract (docs/data.md, "Data contract"): what every checkpoint
and context.json record of the run's data, and a resume on a changed
source refused (exit 3, naming it) unless data.allow_changed=true."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from trainrun import ROOT, STRATA

ARGS = ["configs/test.yml", "model.seq_len=32", "train.steps=2", "train.eval_every=0", "ckpt.every=2",
        "data.synthetic=false", "data.packing=pack", "data.separator=%", "run.progress=off"]


def strata(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([STRATA, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_changed_source_is_refused_then_allowed_and_recorded(tmp_path: Path) -> None:
    src = tmp_path / "corpus.txt"
    shutil.copyfile("/usr/share/games/fortunes/fortunes", src)
    run = tmp_path / "run"
    r = strata("train", *ARGS, f"data.path={src}", f"run.dir={run}")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((run / "checkpoints" / "step_2" / "manifest.json").read_text())
    (source,) = manifest["data"]["sources"]
    assert manifest["data"]["packing"] == "pack" and source["name"] == str(src)
    assert len(source["content_hash"]) == 16 and source["documents"] > 100 and source["drawn"] > 0
    assert source["tokenizer_hash"] == "byte" and source["weight"] == 1
    ctx = json.loads((run / "context.json").read_text())["data"]
    assert ctx["sources"][0]["content_hash"] == source["content_hash"] and ctx["sources"][0]["drawn"] == 0

    # Unchanged: the resume goes on.
    r = strata("train", *ARGS, "train.steps=3", f"data.path={src}", f"run.dir={run}", "run.resume=true")
    assert r.returncode == 0, r.stderr

    with src.open("a") as f:
        f.write("%\nOne more fortune, and the corpus is another.\n")
    r = strata("train", *ARGS, "train.steps=4", f"data.path={src}", f"run.dir={run}", "run.resume=true")
    assert r.returncode == 3, r.stderr
    assert f"data source '{src}' changed" in r.stderr and "step_3" in r.stderr and "data.allow_changed" in r.stderr
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert not any(e["event"] == "step" and e.get("step") == 4 for e in events)

    r = strata("train", *ARGS, "train.steps=4", f"data.path={src}", f"run.dir={run}", "run.resume=true",
               "data.allow_changed=true")
    assert r.returncode == 0, r.stderr
    assert "allowed by data.allow_changed" in r.stderr
    resumed = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()
               if json.loads(x)["event"] == "resumed"][-1]
    (change,) = resumed["data_changed"]
    assert change["source"] == str(src)
    assert change["recorded"]["content_hash"] != change["now"]["content_hash"]
