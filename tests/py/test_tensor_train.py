"""Tensor parallelism through the step plan (docs/parallelism.md): strata's
trainer on parallel.tensor=2, parallel.data=2 x parallel.tensor=2 and
parallel.fsdp=2 x parallel.tensor=2 (4 CPU devices), and all three axes at
once, parallel.data=2 x parallel.fsdp=2 x parallel.tensor=2 (8 CPU
devices), against the same config on one device.

The block's roles in the bundle's program tables name the tensor-parallel
SPMD programs (heads and MLP hidden units split Megatron-style, the
all-reduces inside), launched over all devices at once; embed and head run
as one-device programs on every device, a tensor group on the same rows.
Same bar as tests/py/test_data_parallel.py: 20 steps f32, 2 microbatches,
clipping active, every step's loss within rtol 1e-5, grad norms 1e-4, final
parameters rtol 1e-3 / atol 1e-5. Not bitwise against one device (the
matmuls are split and summed in another order). Bitwise: the replicated
slots across devices and the tensor blocks (under fsdp, their fsdp blocks)
across data replicas (the trainer's replica check, the "saved" event), and
a resume on the same mesh.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from test_data_parallel import OVERRIDES, STRATA, params, run, train

MESHES = {"tensor2": ["parallel.tensor=2"], "data2_tensor2": ["parallel.data=2", "parallel.tensor=2"],
          "fsdp2_tensor2": ["parallel.fsdp=2", "parallel.tensor=2"],
          # all three axes: 8 devices, one row of each microbatch per (data, fsdp) share
          "data2_fsdp2_tensor2": ["parallel.data=2", "parallel.fsdp=2", "parallel.tensor=2", "runtime.cpu_devices=8"],
          # strata's C kernels inside the tensor-parallel programs (each device
          # normalises whole rows and gates its own hidden units): against the
          # one-device xla run, at the same bar; the head's cross-entropy
          # kernel too (a one-device program on each device's rows), and
          # attention on each device's heads.
          "tensor2_ffi": ["parallel.tensor=2", "kernels.rmsnorm=ffi", "kernels.swiglu=ffi",
                          "kernels.cross_entropy=ffi", "kernels.attention=ffi"]}


class _Runs(dict):
    """The one-device run and each mesh's, trained on first use (make
    test-long's three-axis mesh trains only there)."""

    def __init__(self, tmp: object) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, name: str) -> dict:
        self[name] = train(self.tmp, name, *MESHES.get(name, []))
        return self[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _Runs(tmp_path_factory.mktemp("tp"))


# make test: every mesh but the three axes at once (8 devices), a long drill.
MESH_PARAMS = [m if m != "data2_fsdp2_tensor2" else pytest.param(m, marks=pytest.mark.long) for m in sorted(MESHES)]


@pytest.mark.parametrize("mesh", MESH_PARAMS)
def test_losses_and_norms_match_one_device(runs: dict, mesh: str) -> None:
    ours, one = runs[mesh]["steps"], runs["one"]["steps"]
    assert len(ours) == len(one) == 20
    assert any(m["grad_norm"] > 0.5 for m in one), "grad_clip=0.5 never engaged"
    np.testing.assert_allclose([m["loss"] for m in ours], [m["loss"] for m in one], rtol=1e-5)
    np.testing.assert_allclose([m["grad_norm"] for m in ours], [m["grad_norm"] for m in one], rtol=1e-4)
    np.testing.assert_allclose([m["eval_loss"] for m in runs[mesh]["evals"]],
                               [m["eval_loss"] for m in runs["one"]["evals"]], rtol=1e-5)


@pytest.mark.parametrize("mesh", MESH_PARAMS)
def test_final_parameters_match_one_device(runs: dict, mesh: str) -> None:
    ours, one = params(runs[mesh]), params(runs["one"])
    assert sorted(ours) == sorted(one)
    for name in sorted(one):
        # saved whole: the tensor blocks are reassembled along their cut dimension
        assert ours[name].shape == one[name].shape, name
        np.testing.assert_allclose(ours[name], one[name], rtol=1e-3, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("mesh", MESH_PARAMS)
def test_replicas_checked_and_programs(runs: dict, mesh: str) -> None:
    saved = [e for e in runs[mesh]["events"] if e.get("event") == "saved"]
    # fsdp x tensor: every device holds its own blocks of every state tensor,
    # nothing to compare; with data too, each block against its data replica
    assert len(saved) == 1 and (saved[0].get("replicas_bitwise_equal", 0) > 0) == (mesh != "fsdp2_tensor2"), saved
    plan = [e for e in runs[mesh]["events"] if e.get("event") == "plan"][0]
    assert "tensor=2" in plan["policy"]
    # tensor alone needs no inter-layer collective; with data each group's
    # all-reduce; with fsdp all-gathers and reduce-scatters
    n_coll = plan["op_counts"].get("COLLECTIVE", 0)
    assert n_coll == {"tensor2": 0, "data2_tensor2": 4}.get(mesh, n_coll) and n_coll >= 0, plan["op_counts"]
    if mesh == "fsdp2_tensor2":
        assert n_coll > 8 and "fsdp=2" in plan["policy"]
    if mesh == "data2_fsdp2_tensor2":
        # fsdp x tensor's gathers and reduce-scatters, and one data all-reduce per group instance
        ft = [e for e in runs["fsdp2_tensor2"]["events"] if e.get("event") == "plan"][0]
        assert n_coll == ft["op_counts"]["COLLECTIVE"] + 4, plan["op_counts"]
        assert "data=2" in plan["policy"] and "fsdp=2" in plan["policy"]


def test_plan_launches_the_tensor_parallel_programs_on_cut_slots() -> None:
    # Full remat: the forward launches tp_block_fwd (the default, sched.remat=auto
    # without a budget, keeps residuals and launches tp_block_fwd_res instead).
    out = run([STRATA, "plan", "--json", "configs/test.yml", *OVERRIDES, "parallel.tensor=2", "sched.remat=full"]).stdout
    p = json.loads(out)["step"]
    assert p["devices"] == 2 and p["mesh"] == {"data": 1, "fsdp": 1, "tensor": 2}
    progs = {o.get("program") for o in p["ops"] if o["kind"] in ("LAUNCH", "RECOMPUTE")}
    assert {"tp_block_fwd", "tp_block_bwd_res", "tp_sqnorm_block", "tp_adamw_block", "accum_block_tp2"} <= progs, progs
    assert not progs & {"block_fwd", "block_bwd_res", "adamw_block"}
    # The default keeps every residual here: tp_block_fwd_res in the forward, nothing recomputed.
    dflt = json.loads(run([STRATA, "plan", "--json", "configs/test.yml", *OVERRIDES, "parallel.tensor=2"]).stdout)["step"]
    assert "tp_block_fwd_res" in {o.get("program") for o in dflt["ops"] if o["kind"] == "LAUNCH"}
    assert not [o for o in dflt["ops"] if o["kind"] == "RECOMPUTE"] and dflt["remat"]["recompute"] == []
    slots = {s["name"]: s for s in p["slots"]}
    # d_model 32, d_ff 64: wq is cut along dim 1 (heads), wo and w_down along dim 0
    assert slots["layers.0.wq"]["type"] == "f32[32,16]" and slots["layers.0.wq"]["logical_type"] == "f32[32,32]"
    assert slots["layers.0.wq"]["split_axes"] == [0, 4]
    assert slots["layers.0.w_down"]["split_axes"] == [4, 0] and slots["layers.0.w_down"]["type"] == "f32[32,32]"
    assert slots["layers.0.attn_norm"]["layout"] == "replicated" and slots["wte"]["layout"] == "replicated"
    assert slots["m:layers.1.w_up"]["layout"] == "sharded"


def resume_cut_elsewhere(tmp_path, args: list[str], target: list[str]) -> None:  # noqa: ANN001
    """Trains |args| for 6 steps whole and cut at step 3; resumes one copy of
    the cut on |target| (within rtol 1e-5 of the whole run) and one on the
    saving mesh (bit for bit)."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run([STRATA, "train", *args, f"run.dir={whole}"])
    run([STRATA, "train", *args, "train.steps=3", f"run.dir={cut}"])
    same = tmp_path / "same"
    shutil.copytree(cut, same)
    run([STRATA, "resume", str(cut), "train.steps=6", *target])
    run([STRATA, "resume", str(same), "train.steps=6"])

    def losses(d):  # noqa: ANN001, ANN202
        return [json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]

    assert len(losses(cut)) == 6
    np.testing.assert_allclose(losses(cut), losses(whole), rtol=1e-5)
    assert losses(same) == losses(whole)


@pytest.mark.parametrize("target", [[], ["parallel.data=2"], ["parallel.fsdp=2"]],
                         ids=["one_device", "data2", "fsdp2"])
def test_resume_tensor2_on_another_mesh(tmp_path, target: list[str]) -> None:
    """Saved with tensor=2 at step 3: the checkpoint's tensors are whole, so
    one device, data=2 and fsdp=2 continue it within rtol 1e-5 of the
    uninterrupted tensor=2 run; on tensor=2 itself, bit for bit."""
    args = ["configs/test.yml", *OVERRIDES, "parallel.tensor=2", "train.steps=6", "ckpt.every=3"]
    resume_cut_elsewhere(tmp_path, args, ["parallel.tensor=1", *target])


def test_fsdp_tensor_plan_cuts_tensor_blocks_in_fsdp_blocks() -> None:
    out = run([STRATA, "plan", "--json", "configs/test.yml", *OVERRIDES, "parallel.fsdp=2", "parallel.tensor=2"]).stdout
    p = json.loads(out)["step"]
    assert p["mesh"] == {"data": 1, "fsdp": 2, "tensor": 2} and p["serialize_spmd"] is True
    slots = {s["name"]: s for s in p["slots"]}
    # wo [32,32] is row-parallel (dim 0 over tensor), then each tensor block over fsdp: 8 rows
    assert slots["layers.0.wo"]["type"] == "f32[8,32]" and slots["layers.0.wo"]["split_axes"] == [2 | 4, 0]
    # wq [32,32] is column-parallel: dim 1 over tensor, dim 0 over fsdp
    assert slots["layers.0.wq"]["type"] == "f32[16,16]" and slots["layers.0.wq"]["split_axes"] == [2, 4]
    # gathered over fsdp: the tensor block
    assert slots["full:layers.0.wo"]["type"] == "f32[16,32]" and slots["full:layers.0.wo"]["category"] == "gathered"
    assert slots["wte"]["type"] == "f32[128,32]"


def test_three_axes_plan() -> None:
    """data=2 x fsdp=2 x tensor=2: the fsdp x tensor cut (tensor blocks in
    fsdp blocks), its shard programs, and each group's data all-reduce of
    the fsdp blocks after the group's last reduce-scatter."""
    out = run([STRATA, "plan", "--json", "configs/test.yml", *OVERRIDES, "runtime.cpu_devices=8", "parallel.data=2",
               "parallel.fsdp=2", "parallel.tensor=2"]).stdout
    p = json.loads(out)["step"]
    assert p["devices"] == 8 and p["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2} and p["serialize_spmd"] is True
    slots = {s["name"]: s for s in p["slots"]}
    assert slots["layers.0.wo"]["type"] == "f32[8,32]" and slots["layers.0.wo"]["split_axes"] == [2 | 4, 0]
    assert slots["grad:layers.0.wq"]["type"] == "f32[16,16]" and slots["full:layers.0.wo"]["type"] == "f32[16,32]"
    assert {"tp_block_fwd_res", "tp_block_bwd_res", "adamw_block_fsdp2_tp2", "sqnorm_block_fsdp2_tp2",
            "block_data_all_reduce", "block_fsdp_reduce_scatter"} <= set(p["programs"])
    ops = [o for o in p["ops"] if o["kind"] == "COLLECTIVE"]
    ars = [o for o in ops if o["program"].endswith("_data_all_reduce")]
    assert len(ars) == 4  # embed, 2 blocks, head
    for ar in ars:
        g = ar["program"][:-len("_data_all_reduce")]
        rs = [o["index"] for o in ops if o["program"] == f"{g}_fsdp_reduce_scatter" and o["layer"] == ar["layer"]]
        assert len(rs) == 2 and max(rs) < ar["index"], (ar["program"], ar["layer"], rs)  # one per microbatch


def test_resume_three_axes(tmp_path) -> None:
    """data=2 x fsdp=2 x tensor=2 cut at step 3: resumed on the same mesh
    bit for bit, on one device within rtol 1e-5 (the checkpoint's tensors
    are whole)."""
    args = ["configs/test.yml", *OVERRIDES, "runtime.cpu_devices=8", "parallel.data=2", "parallel.fsdp=2",
            "parallel.tensor=2", "train.steps=6", "ckpt.every=3"]
    resume_cut_elsewhere(tmp_path, args, ["parallel.data=1", "parallel.fsdp=1", "parallel.tensor=1"])


@pytest.mark.parametrize("policy", [["sched.remat=none"], ["sched.optimizer=per_layer", "train.grad_clip=0"],
                                    ["sched.offload=optimizer", "sched.wait=eager"]],
                         ids=["remat_none", "per_layer_optimizer", "offload_eager"])
def test_policies_on_fsdp_x_tensor(tmp_path, policy: list[str]) -> None:
    """The other policies keep working on sharded, tensor-cut slots: same
    losses as one device with the same policy. remat=none once failed:
    the evaluation's block fwd (an SPMD program the step plan does not
    launch) was never compiled."""
    base = ["train.steps=4", "train.eval_every=2"]
    one = train(tmp_path, "one", *base, *policy)
    ft = train(tmp_path, "ft", *base, *policy, "parallel.fsdp=2", "parallel.tensor=2")
    np.testing.assert_allclose([m["loss"] for m in ft["steps"]], [m["loss"] for m in one["steps"]], rtol=1e-5)
    np.testing.assert_allclose([m["eval_loss"] for m in ft["evals"]], [m["eval_loss"] for m in one["evals"]], rtol=1e-5)


def test_tensor_parallel_programs_call_the_kernels(runs: dict) -> None:
    """kernels.*=ffi reaches the tp_block programs (they once called the jnp
    ops whatever the config said, while the manifest named ffi)."""
    from pathlib import Path
    ev = [e for e in runs["tensor2_ffi"]["events"] if e.get("event") == "bundle"][0]
    assert ev["kernels"]["rmsnorm"] == "ffi" and ev["kernels"]["swiglu"] == "ffi"
    progs = Path(ev["dir"]) / "programs"
    for prog in ("tp_block_fwd_res", "tp_block_bwd_res"):
        text = (progs / f"{prog}.mlir").read_text()
        assert "strata_rmsnorm_fwd_v1" in text and "strata_swiglu_fwd_v1" in text, prog
    assert "strata_rmsnorm_bwd_v1" in (progs / "tp_block_bwd_res.mlir").read_text()
    assert "strata_swiglu_bwd_v1" in (progs / "tp_block_bwd_res.mlir").read_text()
    head = (progs / "head_loss.mlir").read_text()
    assert "strata_cross_entropy_fwd_v1" in head and "strata_cross_entropy_bwd_v1" in head
    # attention on the device's heads: o and lse from the forward target, the
    # backward target in place of the einsums
    assert ev["kernels"]["attention"] == "ffi"
    assert "strata_attention_fwd_v1" in (progs / "tp_block_fwd_res.mlir").read_text()
    assert "strata_attention_bwd_v1" in (progs / "tp_block_bwd_res.mlir").read_text()
