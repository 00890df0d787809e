"""Optimizers through strata's C trainer (issue 29; docs/model.md
"Optimizers"): the trainer knows no optimizer, it runs the bundle's update
programs on the state slots their inputs declare. Here, against the JAX
reference applying the same registry update (whose arithmetic
tests/py/test_optimizers.py holds to optax):

- each optimizer, 20 steps f32 on configs/test.yml's shape: losses within
  rtol 1e-5, final parameters within rtol 1e-3 / atol 1e-5 (make test:
  muon with AdamW for the rest, the mixed-groups case; the others in make
  test-long);
- each optimizer under fsdp=2 (and tensor=2, fsdp=2 x tensor=2) equals its
  one-device run, and its checkpoint from the mesh resumes on one device
  (make test: muon, adafactor, lion and adamw at once on fsdp=2; the rest
  in make test-long);
- a resume with another optimizer is refused (exit 7) naming both;
- `strata plan` predicts the optimizer state bytes each optimizer's
  definition implies, and the run accounts exactly those.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import STRATA, train_and_reference
from trainrun import ROOT

OVERRIDES = [
    "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.seq_len=32",
    "train.steps=20", "train.batch_size=4", "train.microbatches=2", "train.lr=0.002", "train.warmup_steps=5",
    "train.grad_clip=0.5", "train.eval_every=10", "train.eval_batches=1",
    "data.path=/usr/share/games/fortunes", "data.synthetic=false", "runtime.deterministic=true", "seed=7",
]
SHORT = [o for o in OVERRIDES if not o.startswith(("train.steps", "train.eval_every"))] + [
    "train.steps=6", "train.eval_every=0", "run.progress=off"]

# (optimizer overrides, in make test)
CASES = {
    "muon": (["train.optimizer=muon"], True),
    "sgd": (["train.optimizer=sgd"], False),
    "sgd_nesterov": (["train.optimizer=sgd", "train.nesterov=true"], False),
    "lion": (["train.optimizer=lion", "train.lr=0.0003"], False),
    "adafactor": (["train.optimizer=adafactor"], False),
}


def strata(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([STRATA, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("name", [n if fast else pytest.param(n, marks=pytest.mark.long)
                                  for n, (_, fast) in CASES.items()])
def test_optimizer_matches_reference(name: str, tmp_path: Path) -> None:
    over = CASES[name][0]
    metrics, ref = train_and_reference("configs/test.yml", [*OVERRIDES, *over], tmp_path)
    ours = [m["loss"] for m in metrics if "loss" in m]
    assert len(ours) == 20 and ours[-1] < ours[0], ours
    np.testing.assert_allclose(ours, ref["losses"], rtol=1e-5)
    from safetensors.numpy import load_file

    a = load_file(str(tmp_path / "run" / "params.safetensors"))
    b = load_file(str(tmp_path / "ref" / "params.safetensors"))
    assert sorted(a) == sorted(b)
    for k in sorted(b):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-3, atol=1e-5, err_msg=k)
    # accounted = predicted, optimizer state included, every step
    for m in metrics:
        if "loss" in m:
            assert m["peak_live_by_category"] == m["peak_live_by_category_predicted"], m


def losses(run: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


# (optimizer overrides, mesh overrides, in make test). "mixed" is muon for
# the matrices, adafactor for the (tied) embedding, lion for the vectors:
# the embedding's and the block's updates are SPMD programs that gather
# whole tensors (adafactor's factored moments whole on every device), the
# head's (its final norm, lion) a one-device update of its fsdp block.
MIXED = ["train.optimizer=muon", "train.optimizer_groups=[embed=adafactor, vectors=lion]"]
MESH_CASES = {
    "mixed_fsdp2": (MIXED, ["parallel.fsdp=2", "runtime.cpu_devices=2"], True),
    "lion_fsdp2": (["train.optimizer=lion", "train.lr=0.0003"], ["parallel.fsdp=2", "runtime.cpu_devices=2"], False),
    "adafactor_fsdp2": (["train.optimizer=adafactor"], ["parallel.fsdp=2", "runtime.cpu_devices=2"], False),
    "sgd_nesterov_fsdp2": (["train.optimizer=sgd", "train.nesterov=true"], ["parallel.fsdp=2", "runtime.cpu_devices=2"],
                           False),
    "mixed_tensor2": (MIXED, ["parallel.tensor=2", "runtime.cpu_devices=2"], False),
    "mixed_fsdp2_tensor2": (MIXED, ["parallel.fsdp=2", "parallel.tensor=2", "runtime.cpu_devices=4"], False),
}


@pytest.mark.parametrize("case", [c if fast else pytest.param(c, marks=pytest.mark.long)
                                  for c, (_, _, fast) in MESH_CASES.items()])
def test_optimizer_on_a_mesh_equals_one_device_and_resumes_there(case: str, tmp_path: Path) -> None:
    """Each optimizer's sharded run equals its one-device run (losses rtol
    1e-5: the gradients' reduction order differs), and a checkpoint taken on
    the mesh, its state whole in the files, resumes on one device."""
    opt, mesh, _ = MESH_CASES[case]
    one, sharded, cut = tmp_path / "one", tmp_path / "sharded", tmp_path / "cut"
    for d, extra in ((one, []), (sharded, mesh), (cut, [*mesh, "train.steps=3", "ckpt.every=3"])):
        r = strata("train", "configs/test.yml", *SHORT, *opt, *extra, f"run.dir={d}")
        assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(losses(sharded), losses(one), rtol=1e-5)
    manifest = json.loads((cut / "checkpoints" / "step_3" / "manifest.json").read_text())
    kinds = {t["name"].split(":")[0] for t in manifest["tensors"] if ":" in t["name"]}
    want = ({"mom", "vr", "vc", "m"} if opt is MIXED else {"m"} if "lion" in case else {"mom"} if "sgd" in case
            else {"vr", "vc", "v"})
    assert want <= kinds, kinds
    r = strata("resume", str(cut), "parallel.fsdp=1", "parallel.tensor=1", "train.steps=6")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(losses(cut), losses(one), rtol=1e-5)


def test_resume_with_another_optimizer_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    r = strata("train", "configs/test.yml", *SHORT, "train.optimizer=sgd", "train.steps=2", "ckpt.every=2",
               f"run.dir={run}")
    assert r.returncode == 0, r.stderr
    r = strata("train", "configs/test.yml", *SHORT, "train.optimizer=lion", "train.steps=4", f"run.dir={run}",
               "run.resume=true")
    assert r.returncode == 7, r.stderr
    assert "sgd" in r.stderr and "lion" in r.stderr and "optimizer" in r.stderr, r.stderr


def plan_optimizer_bytes(*over: str) -> tuple[int, int]:
    """(optimizer state bytes the plan holds, parameter bytes)."""
    r = strata("plan", "--json", "configs/test.yml", *SHORT, *over)
    assert r.returncode == 0, r.stderr
    step = json.loads(r.stdout)["step"]
    opt = sum(s["bytes"] for s in step["slots"] if s["persistent"] and s["category"] == "optimizer")
    par = sum(s["bytes"] for s in step["slots"] if s["persistent"] and s["category"] == "params")
    return opt, par


def test_plan_predicts_each_optimizers_state() -> None:
    """Bytes per parameter as docs/model.md states them: adamw 2 x params,
    sgd and lion 1 x; adafactor: a rank-2 parameter [r, c] keeps r + c
    floats, others their own size; muon: 1 x for its matrices, AdamW's 2 x
    for the rest."""
    adamw, params = plan_optimizer_bytes()
    assert adamw == 2 * params
    assert plan_optimizer_bytes("train.optimizer=sgd")[0] == params
    assert plan_optimizer_bytes("train.optimizer=lion")[0] == params
    r = strata("plan", "--json", "configs/test.yml", *SHORT)
    slots = [s for s in json.loads(r.stdout)["step"]["slots"] if s["persistent"] and s["category"] == "params"]

    def numel(t: str) -> list[int]:
        inner = t[t.index("[") + 1:t.index("]")]
        return [int(x) for x in inner.split(",")] if inner else []

    fact = 0
    for s in slots:
        d = numel(s["type"])
        fact += 4 * (d[0] + d[1]) if len(d) == 2 else s["bytes"]
    assert plan_optimizer_bytes("train.optimizer=adafactor")[0] == fact
    muon, _ = plan_optimizer_bytes("train.optimizer=muon")
    assert params < muon < adamw


@pytest.mark.long
def test_gathering_update_with_data_across_processes(tmp_path: Path) -> None:
    """mpirun -np 2, data across the processes and fsdp=2 inside each: the
    gathering updates (muon, adafactor) run within each process and the job
    equals one process on one device (losses rtol 1e-5)."""
    import mpjob

    over = ["model.seq_len=16", "train.batch_size=8", "train.steps=4", "train.warmup_steps=2", *MIXED]
    one, job = tmp_path / "one", tmp_path / "job"
    r = strata("train", "configs/test.yml", *SHORT, *over, f"run.dir={one}")
    assert r.returncode == 0, r.stderr
    mpjob.run([STRATA, "train", "configs/test.yml", *SHORT, *over, "parallel.data=2", "parallel.fsdp=2",
               "runtime.cpu_devices=2", f"run.dir={job}"], 2)
    np.testing.assert_allclose(losses(job), losses(one), rtol=1e-5)
