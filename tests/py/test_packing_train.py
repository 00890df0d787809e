"""Packed training end to end (issue 28; docs/data.md "Packing", "Loss
normalisation", docs/model.md "Packing"): strata's C trainer against the
monolithic JAX reference on the same config, init and batches, with
data.packing=pack over two sources mixed by weight (fortunes split at
their `%` lines), padding present, segment-masked attention and the loss
normalised over the global batch.

20 steps, f32: every step's loss within rtol 1e-5, final parameters within
rtol 1e-3 / atol 1e-5, on one device and under data=2 and fsdp=2 (where
the normalisation must span the devices' rows: a per-device mean would
differ as soon as two devices' rows hold different weights). The
reference runs on one device: the global normalisation is the same
quantity whatever the mesh.

Also: the ffi attention's segment form through the trainer (the JAX-side
isolation tests cannot run ffi, tests/py/test_packing.py): a run at
kernels.attention=ffi equals the reference within the kernel contract's
budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import KERNELS_XLA as KERNELS
from conftest import STRATA, train_and_reference

SOURCES = "[/usr/share/games/fortunes/fortunes,/usr/share/games/fortunes/literature]"
OVERRIDES = [
    "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.seq_len=32",
    "train.steps=20", "train.batch_size=4", "train.microbatches=2", "train.lr=0.002", "train.warmup_steps=5",
    "train.grad_clip=0.5", "train.eval_every=10", "train.eval_batches=1",
    "data.packing=pack", "data.separator=%", f"data.sources={SOURCES}", "data.weights=[0.7,0.3]",
    "data.synthetic=false", "runtime.deterministic=true", "seed=7",
]
MESHES = {
    "one": [],
    "data=2": ["parallel.data=2", "runtime.cpu_devices=2"],
    "fsdp=2": ["parallel.fsdp=2", "runtime.cpu_devices=2"],
}
# make test: one device (and a job of 2 processes below, data across them:
# the weights summed over ranks); data=2 and fsdp=2 in one process, the
# same normalisation over one fill of the whole batch, in make test-long.
MESH_PARAMS = [m if m == "one" else pytest.param(m, marks=pytest.mark.long) for m in MESHES]


@pytest.fixture(scope="module", params=MESH_PARAMS)
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("pack-" + request.param.replace("=", ""))
    metrics, ref = train_and_reference("configs/test.yml", [*OVERRIDES, *MESHES[request.param]], tmp)
    return {"mesh": request.param, "run_dir": tmp / "run", "ref_dir": tmp / "ref", "metrics": metrics, "ref": ref}


def test_losses_match_reference_every_step(runs: dict) -> None:
    ours = [m["loss"] for m in runs["metrics"] if "loss" in m]
    ref = runs["ref"]["losses"]
    assert len(ours) == 20 and len(ref) == 20
    print(f"{runs['mesh']}: max relative loss difference: {max(abs(a - b) / abs(b) for a, b in zip(ours, ref)):.3e}")
    np.testing.assert_allclose(ours, ref, rtol=1e-5)
    np.testing.assert_allclose([m["eval_loss"] for m in runs["metrics"] if "eval_loss" in m],
                               [v for _, v in runs["ref"]["eval_losses"]], rtol=1e-5)


def test_final_parameters_match_reference(runs: dict) -> None:
    from safetensors.numpy import load_file

    ours = load_file(str(runs["run_dir"] / "params.safetensors"))
    ref = load_file(str(runs["ref_dir"] / "params.safetensors"))
    assert sorted(ours) == sorted(ref)
    for name in sorted(ref):
        np.testing.assert_allclose(ours[name], ref[name], rtol=1e-3, atol=1e-5, err_msg=name)


def test_the_batches_hold_padding_and_both_sources(runs: dict) -> None:
    """What makes the normalisation matter: steps whose weights are not all
    ones (padding), differing between steps; and both sources drawn."""
    weights = [m["loss_weight"] for m in runs["metrics"] if "loss" in m]
    full = 4 * 32  # batch x seq_len targets
    assert all(0 < w <= full for w in weights) and min(weights) < full and len(set(weights)) > 1, weights
    manifests = sorted((runs["run_dir"] / "checkpoints").glob("*/manifest.json"))
    data = json.loads(manifests[-1].read_text())["data"]
    assert data["packing"] == "pack" and [s["name"] for s in data["sources"]] == SOURCES.strip("[]").split(",")
    assert all(s["drawn"] > 0 for s in data["sources"]), data["sources"]
    assert data["sources"][0]["drawn"] > data["sources"][1]["drawn"]  # weights 0.7 and 0.3


@pytest.mark.long  # ~8 s; make test keeps the kernel's segment form: tests/c/test_kernels.c, test_kernels.sh's verify
def test_ffi_attention_segments_through_the_trainer(tmp_path: Path) -> None:
    """kernels.attention=ffi (strata_attention_seg_*_v1) against the xla
    reference: the C kernel's own isolation is tests/c/test_kernels.c's;
    here its wiring into the pack programs, 5 steps, within the contract's
    f32 budget for attention (rtol 1e-4 on the loss)."""
    over = [o for o in OVERRIDES if not o.startswith(("train.steps", "train.eval_every"))]
    metrics, ref = train_and_reference("configs/test.yml", [*over, "train.steps=5", "train.eval_every=5",
                                                            "kernels.attention=ffi"], tmp_path)
    ours = [m["loss"] for m in metrics if "loss" in m]
    np.testing.assert_allclose(ours, ref["losses"], rtol=1e-4)
    bundle = json.loads((tmp_path / "run" / "context.json").read_text())["kernels"]
    assert bundle["attention"] == "ffi", bundle


def test_the_normalisation_spans_processes(tmp_path: Path) -> None:
    """`mpirun -np 2` with data spanning the processes: each rank fills its
    rows, the ranks' weight sums are exchanged (st__fill_share), and the job
    trains what one process of one device does, within rounding."""
    from mpjob import run as mp_run

    def losses(procs: int, *extra: str) -> list[float]:
        d = tmp_path / f"p{procs}"
        mp_run([STRATA, "train", "configs/test.yml", *KERNELS, *OVERRIDES, *extra, "run.progress=off",
                f"run.dir={d}"], procs)
        return [json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]

    one = losses(1, "runtime.cpu_devices=1")
    np.testing.assert_allclose(losses(2, "parallel.data=2", "runtime.cpu_devices=1"), one, rtol=1e-5)


def test_resume_after_a_kill_continues_the_document_stream(tmp_path: Path) -> None:
    """SIGKILL during step 7 (faults.crash_at_step; the newest checkpoint is
    step 6), then `strata resume`: steps 7..12 equal the uninterrupted run's
    bit for bit, and so do the final checkpoints' sources' documents drawn."""
    import subprocess

    over = [o for o in OVERRIDES if not o.startswith(("train.steps", "train.eval_every"))]
    args = ["configs/test.yml", *KERNELS, *over, "train.steps=12", "train.eval_every=0", "ckpt.every=3",
            "run.progress=off"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    subprocess.run([STRATA, "train", *args, f"run.dir={whole}"], check=True, capture_output=True)
    r = subprocess.run([STRATA, "train", *args, "faults.crash_at_step=7", f"run.dir={cut}"], capture_output=True,
                       text=True)
    assert r.returncode == -9 or r.returncode == 137, (r.returncode, r.stderr[-2000:])
    subprocess.run([STRATA, "resume", str(cut)], check=True, capture_output=True)

    def steps(d: Path) -> dict[int, float]:
        return {m["step"]: m["loss"] for m in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
                if "loss" in m}

    a, b = steps(whole), steps(cut)
    assert sorted(b) == list(range(1, 13)), sorted(b)
    assert all(a[s] == b[s] for s in range(1, 13)), [(s, a[s], b[s]) for s in range(1, 13) if a[s] != b[s]]

    def sources(d: Path) -> list[dict]:
        return json.loads((d / "checkpoints" / "step_12" / "manifest.json").read_text())["data"]["sources"]

    assert sources(whole) == sources(cut)


@pytest.mark.long  # ~17 s; make test keeps test_data_packing.py's C-vs-Python prompt weights (bitwise)
def test_prompt_targets_weigh_nothing_in_both_trainers(tmp_path: Path) -> None:
    """data.prompt_marker: a corpus of question/answer documents; the
    prompts' targets weigh 0 in the C trainer's batches as in the
    reference's, and the two train alike (5 steps, rtol 1e-5)."""
    rng = np.random.default_rng(3)
    words = ["red", "green", "blue", "north", "south", "seven", "eleven", "river", "stone", "cloud"]
    docs = []
    for _ in range(300):
        q = " ".join(rng.choice(words, size=int(rng.integers(2, 6))))
        a = " ".join(rng.choice(words, size=int(rng.integers(1, 9))))
        docs.append(f"Q: {q}?\n###\nA: {a}.\n")
    corpus = tmp_path / "qa.txt"
    corpus.write_text("%\n".join(docs))
    over = [o for o in OVERRIDES if not o.startswith(("train.steps", "train.eval_every", "data.sources",
                                                      "data.weights"))]
    metrics, ref = train_and_reference("configs/test.yml", [*over, f"data.path={corpus}", "data.prompt_marker=###",
                                                            "train.steps=5", "train.eval_every=5"], tmp_path)
    ours = [m["loss"] for m in metrics if "loss" in m]
    np.testing.assert_allclose(ours, ref["losses"], rtol=1e-5)
    # Every document is prompt then answer: far fewer targets count than
    # the padding alone would leave.
    assert all(m["loss_weight"] < 0.8 * 4 * 32 for m in metrics if "loss" in m)
