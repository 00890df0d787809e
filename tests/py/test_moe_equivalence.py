"""The moe block kind end to end (docs/model.md, "Block kinds", moe): strata's
per-layer C trainer against the monolithic reference, 20 steps, f32, for a
stack of moe layers and for llama and moe layers alternating. Every step's
loss within rtol 1e-4, and the block metrics (aux_loss, z_loss,
expert_load_min/_max) reported by both alike; bad input exits 2."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")

from conftest import train_and_reference  # noqa: E402

COMMON = [
    "model.d_model=32", "model.n_heads=2", "model.d_ff=32", "model.seq_len=16",
    "model.n_experts=4", "model.moe_top_k=2",
    # weights far above the defaults, so that the auxiliary losses' gradients matter
    "model.moe_aux_weight=0.1", "model.moe_z_weight=0.01",
    "train.steps=20", "train.batch_size=4", "train.microbatches=2", "train.lr=0.002", "train.warmup_steps=5",
    "train.grad_clip=0.5", "train.eval_every=10", "train.eval_batches=1",
    "data.path=/usr/share/games/fortunes", "data.synthetic=false", "runtime.deterministic=true", "seed=7",
]
STACKS = {
    # every layer moe; layer 0 recomputed (its metrics then come from moe_fwd)
    "moe": ["model.n_layers=2", "model.block=moe", "sched.remat=0"],
    # a heterogeneous stack, llama and moe alternating
    "alternating": ["model.n_layers=4", "model.layers=[llama,moe,llama,moe]"],
}
METRICS = ("aux_loss", "z_loss", "expert_load_min", "expert_load_max")


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


# The alternating (llama, moe) stack is a long drill: make test keeps the
# moe stack, and test_kinds.py's heterogeneous llama/parallel stack.
@pytest.fixture(scope="module", params=[pytest.param(k, marks=pytest.mark.long) if k == "alternating" else k
                                        for k in sorted(STACKS)])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    over = COMMON + STACKS[request.param]
    tmp = tmp_path_factory.mktemp("moe-" + request.param)
    metrics, ref = train_and_reference("configs/test.yml", over, tmp)
    return {"stack": request.param, "run_dir": tmp / "run", "metrics": [m for m in metrics if "loss" in m],
            "evals": [m for m in metrics if "eval_loss" in m], "ref": ref}


def test_losses_match_reference_every_step(runs: dict) -> None:
    ours = [m["loss"] for m in runs["metrics"]]
    ref = runs["ref"]["losses"]
    assert len(ours) == 20 and len(ref) == 20
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
    print(f"{runs['stack']}: max relative loss difference over 20 steps: {worst:.3e}")
    np.testing.assert_allclose(ours, ref, rtol=1e-4)
    assert ours[-1] < ours[0], "training did not reduce the loss"
    np.testing.assert_allclose([m["eval_loss"] for m in runs["evals"]],
                               [v for _, v in runs["ref"]["eval_losses"]], rtol=1e-4)


def test_block_metrics_match_reference_every_step(runs: dict) -> None:
    for key in METRICS:
        ours = [m[key] for m in runs["metrics"]]
        ref = runs["ref"][key]
        assert len(ours) == len(ref) == 20, key
        if key.startswith("expert_load"):
            # fractions of the N k = 2 x 16 x 2 assignments of a microbatch:
            # the same routing gives the very same numbers
            np.testing.assert_array_equal(ours, ref, err_msg=key)
        else:
            np.testing.assert_allclose(ours, ref, rtol=1e-4, err_msg=key)
    aux = [m["aux_loss"] for m in runs["metrics"]]
    assert all(0 < a <= 4 for a in aux), aux  # n_experts x sum of load x probability: in (0, n_experts]
    assert all(0 <= m["expert_load_min"] <= 0.25 <= m["expert_load_max"] <= 1 for m in runs["metrics"])


def test_top_k_above_n_experts_is_exit_2_naming_the_key(tmp_path) -> None:
    r = subprocess.run([STRATA, "train", "configs/test.yml", *COMMON, *STACKS["moe"], "model.moe_top_k=5",
                        f"run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "model.moe_top_k" in r.stderr and "model.n_experts" in r.stderr


def test_a_device_mesh_is_refused_with_exit_2(tmp_path) -> None:
    r = subprocess.run([STRATA, "train", "configs/test.yml", *COMMON, *STACKS["alternating"], "parallel.data=2",
                        f"run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "'moe'" in r.stderr and "parallel.data" in r.stderr


PRESETS = sorted(glob.glob(os.path.join(ROOT, "configs", "moe-*.yml")))
SHORT = ["model.seq_len=16", "train.batch_size=2", "train.steps=20", "train.eval_every=0", "train.eval_batches=1",
         "data.synthetic=true", "model.vocab_size=256"]


@pytest.mark.parametrize("preset", [os.path.basename(p) for p in PRESETS])
def test_preset_trains_and_plans(preset: str, tmp_path) -> None:
    """configs/moe-*.yml: `strata plan` prints each layer's memory (a moe
    layer keeps no residuals: its metrics are not counted as such), and 20
    steps on synthetic data train with the block metrics in every line."""
    cfg = f"configs/{preset}"
    out = run([STRATA, "plan", cfg, *SHORT]).stdout
    model = json.loads(run([STRATA, "config", "--json", cfg]).stdout)["model"]
    rows = [line for line in out.splitlines() if re.match(r"# layer \d+ ", line)]
    assert len(rows) == model["n_layers"], out[:2000]
    kinds = model["layers"] or [model["block"]] * model["n_layers"]
    assert "moe" in kinds
    for row, kind in zip(rows, kinds):
        m = re.search(r"# layer \d+ +(\w+) +params (\d+) B  state \d+ B  residuals (\d+) B", row)
        assert m and m.group(1) == kind, row
        assert (int(m.group(3)) == 0) == (kind == "moe"), row
    run([STRATA, "train", cfg, *SHORT, f"run.dir={tmp_path / 'run'}"])
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    losses = [m["loss"] for m in lines]
    assert len(losses) == 20 and all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    for m in lines:
        assert all(np.isfinite(m[k]) for k in METRICS), m
        assert 0 <= m["expert_load_min"] <= 1 / model["n_experts"] <= m["expert_load_max"] <= 1, m


def test_there_is_a_moe_preset() -> None:
    assert PRESETS


@pytest.mark.long
def test_greedy_sampling_of_a_moe_stack_equals_full_recompute(tmp_path) -> None:
    """moe_prefill / moe_decode (one token routed at a time, KV caches)
    against test_sample's full re-computation through each kind's forward."""
    from test_sample import PROMPT, TRAIN, reference_greedy, sample

    d = str(tmp_path / "run")
    run([STRATA, "train", *TRAIN, "model.n_layers=3", "model.layers=[moe,llama,moe]", "model.n_experts=4",
         "model.moe_top_k=1", f"run.dir={d}"])
    got = sample(d, "--prompt", PROMPT, "--tokens", "40", "--temperature", "0")
    want = reference_greedy(d, PROMPT.encode(), 40)
    assert got[len(PROMPT):] == want
    assert len(set(want)) > 3, f"a degenerate model makes the comparison weak: {want!r}"
