"""`strata analyze` against JAX's own cost analysis (issue 17, items 1 and 2).

For every program of the tiny and small presets, strata's StableHLO reader
(src/ir/, through `strata analyze BUNDLE --json`) must agree with
`jax.jit(...).lower(...).cost_analysis()` of the same lowered program:
FLOPs within 2 % for the dot-heavy programs (dot FLOPs at least half of the
total) and for every loop-free one, bytes ("bytes accessed", XLA's per-op
unfused sum) within 10 %. Programs with a while loop (the init programs'
threefry rounds) are where the conventions differ on purpose: XLA counts
one iteration, strata the static trip count (docs/analysis.md), so there
strata's counts must be the larger and every loop's trip count known.

A run directory: the per-step totals are the plan's launches times the
programs' FLOPs, and the achieved FLOP/s come from metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import jax
import pytest
from conftest import ROOT

from strata_jax.model import ModelConfig
from strata_jax.programs import build_programs

STRATA = os.path.join(ROOT, "build", "strata")


def _strata(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if not os.access(STRATA, os.X_OK):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    return subprocess.run([STRATA, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def _analyze(path: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    r = _strata("analyze", path, "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _jax_costs(bundle: str) -> dict[str, tuple[str, dict[str, float]]]:
    """name -> (lowered text, cost analysis) for every program of the bundle's model."""
    with open(os.path.join(bundle, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    cfg = ModelConfig.from_dict(manifest["model"])
    out = {}
    for prog in build_programs(cfg):
        jitted = jax.jit(prog.fn, donate_argnums=prog.donated, keep_unused=True)
        lowered = jitted.lower(*(s.struct() for s in prog.inputs))
        ca = lowered.cost_analysis()
        if isinstance(ca, (list, tuple)):
            ca = ca[0]
        out[prog.name] = (lowered.as_text(), dict(ca))
    return out


# small is a long drill (make test-long): tiny keeps every program's count
# against JAX's cost analysis in make test (the same programs, other sizes).
@pytest.mark.parametrize("preset", ["tiny", pytest.param("small", marks=pytest.mark.long)])
def test_flops_and_bytes_agree_with_jax_cost_analysis(preset: str, tmp_path: Any) -> None:
    bundle = str(tmp_path / "bundle")
    # The xla kernels: on CPU the default (kernels auto) is ffi, and a custom
    # call's bytes follow strata's convention, not XLA's (docs/analysis.md).
    xla = [f"kernels.{op}=xla" for op in ("rmsnorm", "swiglu", "attention", "cross_entropy")]
    r = _strata("export", f"configs/{preset}.yml", *xla, f"bundle.dir={bundle}")
    assert r.returncode == 0, r.stderr
    ours = {p["name"]: p for p in _analyze(bundle)["programs"]}
    jax_side = _jax_costs(bundle)
    assert set(ours) == set(jax_side)
    dot_heavy = 0
    for name, (text, ca) in jax_side.items():
        with open(os.path.join(bundle, "programs", f"{name}.mlir"), encoding="utf-8") as f:
            assert f.read() == text, f"{name}: the bundle's text is not the program lowered here"
        p = ours[name]
        assert "error" not in p, f"{name}: {p.get('error')}"
        jf, jb = float(ca.get("flops", 0.0)), float(ca.get("bytes accessed", 0.0))
        assert p["manifest_flops"] == pytest.approx(jf), name  # the exporter's own record of the same
        if p["while"]["count"] > 0:
            assert p["while"]["unknown_trip"] == 0, f"{name}: a loop's trip count was not read"
            assert p["while"]["max_trip"] >= 2, name
            assert p["flops"] > jf and p["bytes_accessed"] > jb, f"{name}: a loop counts its trips"
            continue
        heavy = p["flops"] > 0 and p["dot_flops"] >= 0.5 * p["flops"]
        dot_heavy += heavy
        assert abs(p["flops"] - jf) <= max(0.02 * jf, 2), f"{name}: {p['flops']} FLOPs, JAX {jf}"
        assert abs(p["bytes_accessed"] - jb) <= 0.10 * jb, f"{name}: {p['bytes_accessed']} bytes, JAX {jb}"
        assert p["arg_bytes"] > 0 or name.endswith("_init"), name
        assert not p["hazards"]["dynamic_shapes"] and not p["hazards"]["f64"] and not p["hazards"]["host_callbacks"]
    # block fwd/bwd (and their _res forms), head loss and eval: the matmuls.
    assert dot_heavy >= 6, dot_heavy


def test_run_dir_step_totals(tmp_path: Any) -> None:
    run = str(tmp_path / "run")
    r = _strata("train", "configs/test.yml", "train.steps=3", "run.progress=off", "trace.steps=[2]", f"run.dir={run}")
    assert r.returncode == 0, r.stderr
    a = _analyze(run)
    with open(os.path.join(run, "events.jsonl"), encoding="utf-8") as f:
        bundle_dir = next(e["dir"] for e in map(json.loads, f) if e["event"] == "bundle")
    assert a["bundle"] == bundle_dir
    progs = {p["name"]: p for p in a["programs"]}
    # configs/test.yml: 2 layers, 2 microbatches, remat none by default.
    assert progs["block_fwd_res"]["launches_per_step"] == 2 * 2
    assert progs["block_bwd_res"]["launches_per_step"] == 2 * 2
    assert progs["head_loss"]["launches_per_step"] == 2
    assert progs["adamw_block"]["launches_per_step"] == 2
    assert "launches_per_step" not in progs["block_init"]  # not part of a step
    step = a["step"]
    want = sum(p.get("launches_per_step", 0) * p["flops"] for p in a["programs"])
    assert step["flops"] == pytest.approx(want)
    assert step["tokens"] == 4 * 16
    assert step["model_flops"] > 0 and step["steps_measured"] == 3
    assert step["achieved_flops_per_s"] == pytest.approx(step["flops"] / step["step_time_s"])
    assert 0 <= step["wait_s"] <= step["step_time_s"]
    # The roofline's peak is the one context.json names (the run's MFU used it).
    with open(os.path.join(run, "context.json"), encoding="utf-8") as f:
        ctx_peak = json.load(f)["peak"]
    peak = a["peak"]
    assert {k: peak[k] for k in ("flops_per_s", "bytes_per_s", "source", "detail")} == \
        {k: ctx_peak[k] for k in ("flops_per_s", "bytes_per_s", "source", "detail")}
    assert peak["flops_per_s"] > 0 and step["devices"] == 1
    assert step["mfu"] == pytest.approx(step["model_flops_per_s"] / peak["flops_per_s"])
    _check_bounds(a["programs"], peak)
    assert step["bound_s"] == pytest.approx(sum(p.get("launches_per_step", 0) * p["bound_us"] * 1e-6
                                                for p in a["programs"]))
    measured = [p for p in a["programs"] if p.get("measured_launches")]
    for p in measured:
        assert p["gap"] == pytest.approx(p["measured_us_per_launch"] / p["bound_us"]), p["name"]
    lost = max(measured, key=lambda p: p["measured_launches"] * (p["measured_us_per_launch"] - p["bound_us"]))
    assert step["furthest_from_bound"] == lost["name"]
    # The trace of step 2: every launch of the step once, its time split by role.
    assert step["trace"]["files"] == 1
    for p in a["programs"]:
        assert p.get("measured_launches", 0) == p.get("launches_per_step", 0), p["name"]
    share = step["trace"]["share_by_role"]
    assert set(share) <= {"forward", "backward", "loss", "optimizer"} and sum(share.values()) == pytest.approx(1)
    assert progs["head_loss"]["role"] == "loss" and progs["block_bwd_res"]["role"] == "backward"
    text = _strata("analyze", run)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) <= 40, "the text output fits on a screen"
    assert any(line.startswith("block_bwd_res") for line in lines)
    assert any(line.startswith("peak: ") and "FLOP/s" in line for line in lines)
    assert f"furthest from its bound: {lost['name']}," in text.stdout
    assert any(line.startswith("step:") for line in lines)
    assert any(line.startswith("trace (1 step): device work") for line in lines)


def _check_bounds(programs: list[dict[str, Any]], peak: dict[str, Any]) -> None:
    for p in programs:
        compute = p["flops"] / peak["flops_per_s"]
        memory = (p["arg_bytes"] + p["result_bytes"]) / peak["bytes_per_s"] if peak["bytes_per_s"] else 0
        assert p["bound_us"] == pytest.approx(1e6 * max(compute, memory)), p["name"]
        assert p["bound_by"] == ("memory" if memory > compute else "compute"), p["name"]


def test_roofline_from_doctor(tmp_path: Any) -> None:
    """A bundle's roofline: no bound until strata doctor stored the machine's
    peak FLOP/s and memory bandwidth, then those."""
    env = {"STRATA_CACHE_DIR": str(tmp_path / "cache")}
    bundle = str(tmp_path / "bundle")
    r = _strata("export", "configs/test.yml", f"bundle.dir={bundle}", env=env)
    assert r.returncode == 0, r.stderr
    a = _analyze(bundle, env)
    assert a["peak"]["flops_per_s"] is None and a["peak"]["source"] == "none"
    assert all("bound_us" not in p for p in a["programs"])
    text = _strata("analyze", bundle, env=env)
    assert "peak: not measured (run strata doctor); no roofline bound" in text.stdout
    d = _strata("doctor", env=env)
    assert d.returncode == 0, d.stdout + d.stderr
    (stored,) = [os.path.join(tmp_path, "cache", "matmul_peak", f) for f in os.listdir(tmp_path / "cache" / "matmul_peak")]
    with open(stored, encoding="utf-8") as f:
        m = json.load(f)
    a = _analyze(bundle, env)
    peak = a["peak"]
    assert peak["source"] == "doctor"
    assert peak["flops_per_s"] == pytest.approx(m["best_gflops"] * 1e9)
    assert peak["bytes_per_s"] == pytest.approx(m["best_gbps"] * 1e9)
    _check_bounds(a["programs"], peak)
    # The tiny optimizer programs read and write more than they compute.
    assert {p["name"]: p["bound_by"] for p in a["programs"]}["adamw_block"] == "memory"
    text = _strata("analyze", bundle, env=env)
    assert "peak: " in text.stdout and "(doctor: 512x512 f32 matmul on cpu" in text.stdout


def test_bad_input_is_an_error(tmp_path: Any) -> None:
    r = _strata("analyze", str(tmp_path))
    assert r.returncode == 2 and "neither manifest.json" in r.stderr
    r = _strata("analyze")
    assert r.returncode == 2 and "usage" in r.stderr
