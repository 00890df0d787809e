"""diag.numerics (docs/diagnostics.md, "What is measured"): the statistics
strata writes to metrics.jsonl, checked against what they describe, read
independently: the final parameters and the checkpoint before them (their
norms, the update between them), the gradient norm of the sqnorm programs,
and a NaN injected by faults.nan_at into one element of one layer's output.
Also: the statistics change nothing (parameters bitwise equal to a run
with diag.numerics=off)."""

from __future__ import annotations

import json
import math
import os
import subprocess

import numpy as np
import pytest
from conftest import ROOT
from safetensors.numpy import load_file

STRATA = os.path.join(ROOT, "build", "strata")
BASE = ["configs/test.yml", "runtime.deterministic=true", "runtime.cpu_devices=1", "run.progress=off",
        "train.steps=3", "ckpt.every=1", "ckpt.keep=5", "train.eval_every=0"]


def train(d: str, *extra: str) -> list[dict]:
    # The suite's cache (the bundles and executables are shared with every
    # test training configs/test.yml; nothing here needs an empty one).
    r = subprocess.run([STRATA, "train", *BASE, f"run.dir={d}", *extra], cwd=ROOT, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    with open(os.path.join(d, "metrics.jsonl"), encoding="utf-8") as f:
        return [j for j in map(json.loads, f) if "loss" in j]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("numerics")
    out = {}
    for name, extra in (("off", []), ("layer", ["diag.numerics=layer"])):
        d = str(root / name)
        train(d, *extra)
        out[name] = d
    return out


def lines(d: str) -> list[dict]:
    with open(os.path.join(d, "metrics.jsonl"), encoding="utf-8") as f:
        return [j for j in map(json.loads, f) if "loss" in j]


def test_statistics_change_nothing(runs: dict[str, str]) -> None:
    with open(os.path.join(runs["off"], "params.safetensors"), "rb") as a, \
            open(os.path.join(runs["layer"], "params.safetensors"), "rb") as b:
        assert a.read() == b.read()
    assert "param_norm" not in lines(runs["off"])[0]


def test_norms_match_the_parameters(runs: dict[str, str]) -> None:
    d = runs["layer"]
    last = lines(d)[-1]
    new = load_file(os.path.join(d, "checkpoints", "step_3", "params.safetensors"))
    old = load_file(os.path.join(d, "checkpoints", "step_2", "params.safetensors"))
    p2 = sum(float(np.sum(v.astype(np.float64) ** 2)) for v in new.values())
    u2 = sum(float(np.sum((new[k].astype(np.float64) - old[k].astype(np.float64)) ** 2)) for k in new)
    assert last["param_norm"] == pytest.approx(math.sqrt(p2), rel=1e-5)
    assert last["update_norm"] == pytest.approx(math.sqrt(u2), rel=1e-4)
    assert last["update_ratio"] == pytest.approx(math.sqrt(u2 / p2), rel=1e-4)
    # per layer: a block's parameters after the update
    blk = [k for k in new if k.startswith("layers.1.")]
    n = sum(new[k].size for k in blk)
    rms = math.sqrt(sum(float(np.sum(new[k].astype(np.float64) ** 2)) for k in blk) / n)
    assert last["numerics/layer1/param_rms"] == pytest.approx(rms, rel=1e-5)
    upd_max = max(float(np.max(np.abs(new[k] - old[k]))) for k in blk)
    assert last["numerics/layer1/update_maxabs"] == pytest.approx(upd_max, rel=1e-5)


def test_gradient_statistics_add_up_to_the_gradient_norm(runs: dict[str, str]) -> None:
    d = runs["layer"]
    params = load_file(os.path.join(d, "params.safetensors"))
    numel = {"embed": params["wte"].size,
             "head": sum(v.size for k, v in params.items() if not k.startswith("layers.") and k != "wte")}
    for layer in range(2):
        numel[f"layer{layer}"] = sum(v.size for k, v in params.items() if k.startswith(f"layers.{layer}."))
    for line in lines(d):
        total = sum(line[f"numerics/{s}/grad_rms"] ** 2 * n for s, n in numel.items())
        assert math.sqrt(total) == pytest.approx(line["grad_norm"], rel=1e-4)
        for s in numel:
            assert line[f"numerics/{s}/grad_nonfinite"] == 0
            assert 0 < line[f"numerics/{s}/grad_maxabs"] <= line["grad_norm"]
        for layer in range(2):
            for t in ("out", "dx"):
                assert line[f"numerics/layer{layer}/{t}_nonfinite"] == 0
                assert 0 < line[f"numerics/layer{layer}/{t}_rms"] <= line[f"numerics/layer{layer}/{t}_maxabs"]


def test_an_injected_nan_is_counted_where_it_is(tmp_path: os.PathLike) -> None:
    d = str(tmp_path / "nan")
    ls = train(d, "diag.numerics=layer", "faults.nan_at=2:1", "faults.nan_micro=1", "diag.on_nonfinite=skip")
    step2 = next(j for j in ls if j["step"] == 2)
    assert step2["update_skipped"] is True and step2["skipped_steps"] == 1
    assert step2["numerics/layer0/out_nonfinite"] == 0
    assert step2["numerics/layer1/out_nonfinite"] == 1  # the one element, in one of two microbatches
    # over the finite elements: as the other microbatch's and the rest of this one's
    assert 0 < step2["numerics/layer1/out_maxabs"] < 1 and 0 < step2["numerics/layer1/out_rms"] < 1
    assert step2["numerics/layer1/dx_nonfinite"] > 0  # the loss is NaN: every gradient is
    assert "param_norm" not in step2 and "numerics/layer1/update_rms" not in step2  # no update was applied
    step3 = next(j for j in ls if j["step"] == 3)
    assert step3["numerics/layer1/out_nonfinite"] == 0 and math.isfinite(step3["param_norm"])
