"""train.lr_schedule against optax (issue 29, docs/model.md "Learning-rate
schedules"): each schedule's per-step lr in a short `strata train` run's
metrics.jsonl equals optax's schedule at the same steps and docs/model.md's
formulas (in Python doubles: the same doubles), the manifest records the
definition, and a wsd run killed in its decay and resumed continues the curve
bitwise.

Where the definitions differ, the test applies strata's to both:
- Step indexing. strata's optimizer step t is 1-based and trains at
  schedule(t), so its first step trains at lr / warmup_steps; an optax
  optimizer's first update reads count 0 (init_value, 0 here). optax's
  schedule is evaluated at count t.
- wsd. optax has no warmup-stable-decay schedule: the test joins a linear
  warmup, a constant and a linear decay (optax.join_schedules) at strata's
  boundaries, the decay taking the last decay_steps steps, strata's
  round(decay_fraction * (steps - warmup_steps)), which the manifest records.

Tolerances, from the arithmetic. strata computes in float64 and writes the
double exactly (every real in metrics.jsonl reads back to itself). optax in
f32 (JAX's default) evaluates each value in at most ~10 roundings, each at
most 2^-24 of a quantity no larger than the peak lr, and the rounding of
pi * p moves cos by at most pi * 2^-23: |optax_f32 - exact| < 16 * 2^-24 *
peak = 2^-20 * peak; the test allows 2^-19 * peak. Under jax.enable_x64 the
same count in 2^-53 units bounds optax's float64 and strata's own roundings
together by 32 * 2^-53 * peak = 2^-48 * peak.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
import pytest

from conftest import ROOT, STRATA, run_ok

STEPS, WARMUP, PEAK, RATIO, FRACTION = 40, 5, 3e-3, 0.1, 0.25
BASE = ["configs/test.yml", f"train.steps={STEPS}", f"train.warmup_steps={WARMUP}", f"train.lr={PEAK}",
        f"train.min_lr_ratio={RATIO}", f"train.decay_fraction={FRACTION}", "train.eval_every=0",
        "runtime.deterministic=true", "runtime.cpu_devices=1", "ckpt.every=17", "ckpt.async=false"]
SCHEDULES = ["constant", "linear", "cosine", "wsd"]


def decay_steps(name: str, fraction: float = FRACTION, warmup: int = WARMUP, steps: int = STEPS) -> int:
    """docs/model.md: linear decays every step after the warmup, wsd the
    last round(fraction * (steps - warmup)) (C's llround: halves up)."""
    span = max(1, steps - warmup)
    if name == "linear":
        return span
    x = fraction * span
    d = int(x) + (1 if x - int(x) >= 0.5 else 0)
    return min(max(d, 1), span)


def strata_lr(name: str, t: int, lr: float = PEAK, ratio: float = RATIO, warmup: int = WARMUP, steps: int = STEPS,
              fraction: float = FRACTION) -> float:
    """docs/model.md's formulas with st_plan_lr's operations, in doubles."""
    if warmup > 0 and t <= warmup:
        return lr * t / warmup
    if name == "constant":
        return lr
    min_lr = lr * ratio
    if name == "cosine":
        p = min(1.0, (t - warmup) / max(1, steps - warmup))
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))
    d = decay_steps(name, fraction, warmup, steps)
    k = t - (steps - d)
    return lr if k <= 0 else min_lr + (lr - min_lr) * ((d - min(k, d)) / d)


def optax_schedule(name: str) -> optax.Schedule:
    """strata's schedule |name| with optax's pieces, evaluated at strata's t."""
    end = PEAK * RATIO
    warm = optax.linear_schedule(0.0, PEAK, WARMUP)
    if name == "constant":
        return optax.join_schedules([warm, optax.constant_schedule(PEAK)], [WARMUP])
    if name == "linear":
        return optax.join_schedules([warm, optax.linear_schedule(PEAK, end, STEPS - WARMUP)], [WARMUP])
    if name == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, PEAK, WARMUP, STEPS, end)
    d = decay_steps("wsd")
    return optax.join_schedules([warm, optax.constant_schedule(PEAK), optax.linear_schedule(PEAK, end, d)],
                                [WARMUP, STEPS - d])


def step_lines(run_dir: Path) -> list[dict[str, Any]]:
    return [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in m]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not os.path.exists(STRATA):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    out = tmp_path_factory.mktemp("lr_schedule")
    for name in SCHEDULES:
        run_ok([STRATA, "train", *BASE, f"train.lr_schedule={name}", f"run.dir={out / name}"])
    return {name: out / name for name in SCHEDULES}


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedule_equals_optax(runs: dict[str, Path], name: str) -> None:
    lines = step_lines(runs[name])
    t = np.array([m["step"] for m in lines])
    assert list(t) == list(range(1, STEPS + 1))
    got = np.array([m["lr"] for m in lines], np.float64)
    with jax.enable_x64(True):
        ref64 = np.asarray(optax_schedule(name)(np.asarray(t, np.int64)), np.float64)
    assert ref64.dtype == np.float64
    np.testing.assert_allclose(got, ref64, rtol=0, atol=2.0**-48 * PEAK)
    ref32 = np.asarray(optax_schedule(name)(t), np.float64)
    np.testing.assert_allclose(got, ref32, rtol=0, atol=2.0**-19 * PEAK)
    # The documented formulas with the same operations give the same doubles.
    assert list(got) == [strata_lr(name, int(k)) for k in t]
    # Shape: the peak after the warmup, the floor at the end (constant stays at the peak).
    assert got[WARMUP - 1] == pytest.approx(PEAK, rel=1e-15)
    assert got[-1] == pytest.approx(PEAK if name == "constant" else PEAK * RATIO, rel=1e-12)


def test_manifest_records_the_schedule(runs: dict[str, Path]) -> None:
    want = {
        "constant": {"schedule": "constant"},
        "linear": {"schedule": "linear", "min_lr_ratio": RATIO, "decay_steps": STEPS - WARMUP},
        "cosine": {"schedule": "cosine", "min_lr_ratio": RATIO},
        # 0.25 * 35 = 8.75: the last 9 steps decay
        "wsd": {"schedule": "wsd", "min_lr_ratio": RATIO, "decay_fraction": FRACTION, "decay_steps": 9},
    }
    for name, extra in want.items():
        rec = json.loads((runs[name] / "checkpoints" / f"step_{STEPS}" / "manifest.json").read_text())["lr_schedule"]
        lr = step_lines(runs[name])[-1]["lr"]
        assert rec == {"step": STEPS, "total_steps": STEPS, "lr": lr, "peak_lr": PEAK, "warmup_steps": WARMUP,
                       **extra}, name


def test_wsd_resume_continues_the_curve(runs: dict[str, Path], tmp_path: Path) -> None:
    """Killed during step 36, in the decay (steps 32..40), resumed from
    step_34: every step line, replayed ones too, equals the uninterrupted
    run's, lr and loss bitwise."""
    d = tmp_path / "cut"
    r = subprocess.run([STRATA, "train", *BASE, "train.lr_schedule=wsd", "faults.crash_at_step=36", f"run.dir={d}"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == -9, r.stderr  # SIGKILL
    r = run_ok([STRATA, "resume", str(d)])
    assert "the lr schedule differs" not in r.stderr
    resumed = [e for e in map(json.loads, (d / "events.jsonl").read_text().splitlines()) if e["event"] == "resumed"]
    assert [e["from_step"] for e in resumed] == [34]
    assert resumed[0]["lr_schedule_changed"] is False
    assert resumed[0]["lr_schedule"] == resumed[0]["checkpoint_lr_schedule"]
    whole = {m["step"]: (m["lr"], m["loss"]) for m in step_lines(runs["wsd"])}
    lines = step_lines(d)
    assert [m["step"] for m in lines] == [*range(1, 36), *range(35, STEPS + 1)]  # step 35 ran twice
    for m in lines:
        assert (m["lr"], m["loss"]) == whole[m["step"]], m["step"]
    assert (d / "params.safetensors").read_bytes() == (runs["wsd"] / "params.safetensors").read_bytes()


def test_resume_with_another_schedule_is_said(runs: dict[str, Path], tmp_path: Path) -> None:
    """A different schedule on resume is a train.* change like any other:
    allowed, named on stderr with both definitions and the next lr under
    each, recorded in the resumed event; the lr then follows the new one."""
    d = tmp_path / "changed"
    shutil.copytree(runs["wsd"], d)
    for s in (34, STEPS):
        shutil.rmtree(d / "checkpoints" / f"step_{s}")
    (d / "checkpoints" / "LATEST").write_text("step_17\n")
    r = run_ok([STRATA, "resume", str(d), "train.lr_schedule=cosine"])
    nxt = strata_lr("cosine", 18)
    assert "the lr schedule differs from the checkpoint's" in r.stderr
    assert '"schedule": "wsd"' in r.stderr and '"schedule": "cosine"' in r.stderr
    assert f"from step 18 the lr follows this run's ({nxt:.9g}; the checkpoint's would be {PEAK:.9g})" in r.stderr
    e = [e for e in map(json.loads, (d / "events.jsonl").read_text().splitlines()) if e["event"] == "resumed"][-1]
    assert e["from_step"] == 17 and e["lr_schedule_changed"] is True
    assert e["checkpoint_lr_schedule"]["schedule"] == "wsd" and e["lr_schedule"]["schedule"] == "cosine"
    after = [m for m in step_lines(d) if m["step"] > 17][-(STEPS - 17):]
    assert [m["lr"] for m in after] == [m["lr"] for m in step_lines(runs["cosine"])][17:]
