"""MFU in every run (issue 17, item 3): each step line of metrics.jsonl
carries model_flops_per_s and mfu, and they are bench/flops.py's formula
for the same run over the peak context.json names (obs.peak_flops, a
datasheet figure, or the matmul peak strata doctor measured)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml
from conftest import ROOT

sys.path.insert(0, ROOT)
from bench import flops as FL  # noqa: E402

STRATA = os.path.join(ROOT, "build", "strata")


def _train(run: str, *over: str) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    r = subprocess.run([STRATA, "train", "configs/test.yml", "train.steps=3", "run.progress=off", f"run.dir={run}", *over],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
        steps = [m for m in map(json.loads, f) if "loss" in m]
    with open(os.path.join(run, "context.json"), encoding="utf-8") as f:
        ctx = json.load(f)
    with open(os.path.join(run, "config.yaml"), encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    return steps, ctx, cfg


def _check(steps: list[dict[str, Any]], cfg: dict[str, Any], peak_total: float) -> None:
    want_flops = FL.step_flops(cfg)
    assert len(steps) == 3
    for m in steps:
        # step_time_s is written to the microsecond, the rates from the exact
        # time: rate x written time is the step's FLOPs within half a microsecond's.
        rate = m["model_flops_per_s"]
        assert abs(rate * m["step_time_s"] - want_flops) <= rate * 0.5e-6 + 1e-9 * want_flops, (rate, m, want_flops)
        # Both written to 9 significant digits: each within 5e-9 of its exact value.
        assert m["mfu"] == pytest.approx(rate / peak_total, rel=1.1e-8)


def test_mfu_with_a_configured_peak(tmp_path: Any) -> None:
    steps, ctx, cfg = _train(str(tmp_path / "run"), "obs.peak_flops=2.5e11")
    assert ctx["peak"] == {"flops_per_s": 2.5e11, "bytes_per_s": ctx["peak"]["bytes_per_s"], "devices": 1,
                           "source": "config", "detail": "obs.peak_flops"}
    _check(steps, cfg, 2.5e11)


@pytest.mark.long
def test_mfu_of_a_gpt2_gqa_stack(tmp_path: Any) -> None:
    """The model FLOPs of other kinds: gpt2's two MLP matrices, k and v at
    n_kv_heads, the real (not the padded) vocabulary."""
    steps, _, cfg = _train(str(tmp_path / "run"), "obs.peak_flops=2.5e11", "model.block=gpt2", "model.n_kv_heads=2",
                           "model.vocab_padded=320")
    assert FL.forward_flops_per_token(cfg["model"]) < FL.forward_flops_per_token(
        {**cfg["model"], "block": "llama", "n_kv_heads": 0})
    _check(steps, cfg, 2.5e11)


def test_mfu_with_the_measured_peak(tmp_path: Any) -> None:
    steps, ctx, cfg = _train(str(tmp_path / "run"))
    peak = ctx["peak"]
    # CPU: no datasheet; doctor's stored measurement, or the run's own.
    assert peak["source"] in ("doctor", "train") and peak["flops_per_s"] > 0, peak
    assert "f32 matmul on cpu" in peak["detail"]
    _check(steps, cfg, peak["flops_per_s"] * peak["devices"])
