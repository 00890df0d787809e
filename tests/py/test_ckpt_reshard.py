"""Checkpoints across meshes (docs/checkpoints.md, "Across meshes"; issue 12,
deliverable 7, for the meshes the trainer has: one device, parallel.data and
parallel.fsdp).

A checkpoint holds every tensor whole (each replica is the same value), and
its identity is the model, not the per-device microbatch or the mesh: a run
saved with data=2 resumes on one device and with data=4, a one-device
checkpoint resumes with data=2, and the losses after the resume stay within
rtol 1e-5 of the uninterrupted run on the saving mesh (the meshes add the
same f32 values in another order, so not bitwise). On the same mesh the
resume is bitwise. A manifest that claims a layout this reader cannot
reassemble is refused with exit 7, naming the tensor.

FSDP state is saved whole too: the trainer reassembles each parameter, m and
v from the devices' fsdp blocks (dropping the padding) and cuts a loaded
tensor into blocks again. So a run saved with fsdp=4 resumes with data=2 and
on one device, a one-device checkpoint resumes with fsdp=4, and an fsdp=4
checkpoint resumes on fsdp=4 bitwise, with the same tolerances. Its manifest
records the mesh {data 1, fsdp 4}; the layouts stay "whole". Measured after
the cut: fsdp=4 -> data=2 5.7e-8, fsdp=4 -> one device 9.8e-8, one device ->
fsdp=4 4.4e-8 relative (the data ones 6.8e-8). A claimed block layout is
refused by the fsdp loader too (exit 7, naming the tensor): every whole
tensor can be cut into fsdp blocks (any dim 0, zero-padded), so a layout
claim is the one way a checkpoint's tensor cannot be resharded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")
DRILL = os.path.join(ROOT, "tests", "e2e", "ckpt_drill.py")

OVERRIDES = [
    "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.seq_len=32",
    "train.batch_size=8", "train.microbatches=2", "train.lr=0.002", "train.warmup_steps=5",  # the cut run (train.steps=3) has the same LR as the whole run up to the cut
    "train.grad_clip=0.5", "train.eval_every=0", "train.eval_batches=1",
    "data.path=/usr/share/games/fortunes", "data.synthetic=false", "runtime.deterministic=true", "seed=7",
    "runtime.cpu_devices=4", "ckpt.every=3", "ckpt.async=false",
]
STEPS, CUT = 6, 3


def run(cmd: list[str], expect: int = 0) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != expect:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}, expected {expect}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


def losses(d) -> dict[int, float]:
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m["loss"] for m in lines if "loss" in m}


# Mesh keys: an int is parallel.data, "f4" is parallel.fsdp=4.
FSDP4 = "f4"


def mesh_args(mesh) -> list[str]:
    # both axes: a resumed run's config.yaml holds the saving mesh
    return ["parallel.data=1", "parallel.fsdp=4"] if mesh == FSDP4 else [f"parallel.data={mesh}", "parallel.fsdp=1"]


def mesh_record(mesh) -> dict:
    if mesh == FSDP4:
        return {"data": 1, "fsdp": 4, "tensor": 1, "devices": 4}
    return {"data": mesh, "fsdp": 1, "tensor": 1, "devices": mesh}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not os.path.exists(STRATA):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    tmp = tmp_path_factory.mktemp("reshard")
    out = {"tmp": tmp}
    for data in (1, 2, FSDP4):
        whole, cut = tmp / f"whole{data}", tmp / f"cut{data}"
        run([STRATA, "train", "configs/test.yml", *OVERRIDES, *mesh_args(data), f"train.steps={STEPS}", f"run.dir={whole}"])
        run([STRATA, "train", "configs/test.yml", *OVERRIDES, *mesh_args(data), f"train.steps={CUT}", f"run.dir={cut}"])
        out[f"whole{data}"], out[f"cut{data}"] = whole, cut
    return out


def resume_on(runs: dict, saved, data) -> dict:
    """Copies the run cut at step CUT on mesh |saved| and resumes the copy on mesh |data|."""
    dst = runs["tmp"] / f"from{saved}_on{data}"
    if not dst.exists():
        shutil.copytree(runs[f"cut{saved}"], dst)
        r = run([STRATA, "resume", str(dst), f"train.steps={STEPS}", *mesh_args(data)])
        (dst / "resume.stderr").write_text(r.stderr)
    events = [json.loads(x) for x in (dst / "events.jsonl").read_text().splitlines()]
    return {"dir": dst, "losses": losses(dst), "resumed": [e for e in events if e.get("event") == "resumed"][-1]}


def test_manifest_records_the_mesh(runs: dict) -> None:
    for data in (1, 2, FSDP4):
        m = json.loads((runs[f"cut{data}"] / "checkpoints" / f"step_{CUT}" / "manifest.json").read_text())
        assert m["mesh"] == mesh_record(data)
        # The identity is the model: the whole microbatch, not one device's share.
        assert m["model"]["microbatch_size"] == 4
        assert {t["layout"] for t in m["tensors"]} == {"whole"}
    one = json.loads((runs["cut1"] / "checkpoints" / f"step_{CUT}" / "manifest.json").read_text())
    two = json.loads((runs["cut2"] / "checkpoints" / f"step_{CUT}" / "manifest.json").read_text())
    assert one["bundle_key"] == two["bundle_key"] and one["model"] == two["model"]
    # fsdp=4 exports another bundle (its collectives and block programs); the model is the same
    four = json.loads((runs[f"cut{FSDP4}"] / "checkpoints" / f"step_{CUT}" / "manifest.json").read_text())
    assert four["model"] == one["model"]
    shapes = {t["name"]: t["shape"] for t in one["tensors"]}
    assert {t["name"]: t["shape"] for t in four["tensors"]} == shapes  # whole tensors, not blocks


@pytest.mark.parametrize("saved,data", [(2, 1), (2, 4), (1, 2), (FSDP4, 2), (FSDP4, 1), (1, FSDP4)])
def test_resume_on_another_mesh(runs: dict, saved: int, data: int) -> None:
    r = resume_on(runs, saved, data)
    whole = losses(runs[f"whole{saved}"])
    got = r["losses"]
    assert sorted(got) == list(range(1, STEPS + 1))
    assert r["resumed"]["from_step"] == CUT
    assert r["resumed"]["checkpoint_mesh"] == mesh_record(saved)
    assert r["resumed"]["mesh"] == mesh_record(data)
    # Steps before the cut were run on the saving mesh: bitwise the same run.
    assert [got[s] for s in range(1, CUT + 1)] == [whole[s] for s in range(1, CUT + 1)]
    after = np.array([got[s] for s in range(CUT + 1, STEPS + 1)])
    ref = np.array([whole[s] for s in range(CUT + 1, STEPS + 1)])
    print(f"saved on {saved}, resumed on {data}: max relative loss difference {np.max(np.abs(after - ref) / np.abs(ref)):.1e}")
    np.testing.assert_allclose(after, ref, rtol=1e-5, atol=0)
    assert "written on mesh" in (r["dir"] / "resume.stderr").read_text()
    # The resumed run's own checkpoint records the mesh it was written with.
    m = json.loads((r["dir"] / "checkpoints" / f"step_{STEPS}" / "manifest.json").read_text())
    assert m["mesh"] == mesh_record(data)


@pytest.mark.parametrize("data", [1, 2, FSDP4])
def test_resume_on_the_same_mesh_is_bitwise(runs: dict, data: int) -> None:
    r = resume_on(runs, data, data)
    assert r["losses"] == losses(runs[f"whole{data}"])
    assert "written on mesh" not in (r["dir"] / "resume.stderr").read_text()


def resign(ckpt, edit) -> None:
    """Edits the manifest and re-signs it as strata does (ckpt_drill.py's
    fixmanifest): xxh64 of every byte before the manifest_xxh64 line."""
    sys.path.insert(0, os.path.dirname(DRILL))
    from ckpt_drill import xxh64
    path = ckpt / "manifest.json"
    m = json.loads(path.read_text())
    del m["manifest_xxh64"]
    edit(m)
    body = "{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in m.items())
    path.write_text(body + f'  "manifest_xxh64": "{xxh64(body.encode()):016x}"\n}}\n')


@pytest.mark.parametrize("saved,data", [(2, 1), (FSDP4, FSDP4), (FSDP4, 2)])
def test_a_layout_the_reader_cannot_reassemble_is_exit_7_naming_the_tensor(runs: dict, saved, data) -> None:
    """Checkpoints hold whole tensors only; the fsdp loader (which cuts whole
    tensors into blocks) refuses a claimed block layout as the others do,
    on the saving mesh and on another."""
    dst = runs["tmp"] / f"sharded_claim_{saved}_{data}"
    shutil.copytree(runs[f"cut{saved}"], dst)
    ck = dst / "checkpoints" / f"step_{CUT}"

    def claim_shards(m: dict) -> None:
        for t in m["tensors"]:
            if t["name"] == "layers.1.wq":
                t["layout"] = "fsdp_shards"

    resign(ck, claim_shards)
    r = run([STRATA, "resume", str(dst), f"train.steps={STEPS}", *mesh_args(data)], expect=7)
    assert "tensor 'layers.1.wq' is stored with layout \"fsdp_shards\"" in r.stderr, r.stderr
    assert "no valid checkpoint" in r.stderr
    # The checkpoint is not valid in itself either: `strata ckpt verify` says so.
    v = run([STRATA, "ckpt", "verify", str(ck)], expect=7)
    assert "layers.1.wq" in v.stderr + v.stdout


def test_a_mesh_larger_than_the_manifest_allows_is_exit_7(runs: dict) -> None:
    """A manifest mesh whose axes do not multiply to its device count cannot
    have written these tensors: refused, naming the field."""
    dst = runs["tmp"] / "bad_mesh"
    shutil.copytree(runs["cut2"], dst)
    ck = dst / "checkpoints" / f"step_{CUT}"
    resign(ck, lambda m: m["mesh"].update(devices=3))
    r = run([STRATA, "resume", str(dst), f"train.steps={STEPS}"], expect=7)
    assert "\"mesh\"" in r.stderr and "devices 3" in r.stderr, r.stderr
