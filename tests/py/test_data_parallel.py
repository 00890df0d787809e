"""Data and fully-sharded parallelism through the step plan (docs/parallelism.md):
strata's trainer on parallel.data=2 and =4, parallel.fsdp=2 and =4 and
data=2 x fsdp=2 (4 CPU devices) against the same config on one device, and
data=2 and fsdp=2 with sched.optimizer=per_layer against one device with it
(those three runs in make test-long; make test keeps per-layer updates on a
mesh in test_tensor_train.py, fsdp x tensor).

20 steps, f32, 2 microbatches, clipping active. Each device runs the one-device
programs on its rows of every microbatch; the plan all-reduces each layer's
gradients (COLLECTIVE ops) and folds 1/data into the gradient scale. Required:
every step's loss within rtol 1e-5 of the 1-device run, final parameters within
rtol 1e-3 / atol 1e-5, every replicated slot bitwise equal on every device at
the end (the trainer checks and reports it in the "saved" event), and the
collectives counted in metrics.jsonl.

Under FSDP each device holds one fsdp block (dim 0 cut in ceil(d0/fsdp) rows)
of the parameters, gradients and m, v; the plan all-gathers a layer's
parameters around each use, reduce-scatters its whole gradients into blocks
after each microbatch's backward (and all-reduces the blocks over data on
data=2 x fsdp=2), and the optimizer programs run on the blocks. The same
tolerances hold, the grad norm included: it is the host's sum of every
device's block norms, a wrong 1/(data x fsdp) scale or a block counted twice
shows there.

Not bitwise against one device, and not expected to be: a device's loss is
the mean over its own rows and the gradient a sum of per-device sums, so the
f32 additions happen in another order (the rounding, not the math, differs).

Bitwise: every replicated slot across the devices of a data-parallel run,
and on data=2 x fsdp=2 every fsdp block across its data replicas (mesh index
p against p mod fsdp, checked by the trainer at the end; on fsdp=2 and
fsdp=4 nothing is replicated, every device holds its own blocks). Also
bitwise: the first step's loss of fsdp=2 against data=2, of fsdp=4 and data=2
x fsdp=2 against data=4 (the same rows per device, the same programs on
bitwise-equal gathered parameters); after it the clip scale rounds
differently (test_fsdp_first_loss_bitwise_equal_to_data_parallel).

Measured (fsdp=2 with the default policies, fsdp=4 with gather_prefetch=2 and
reshard_after_forward=false, data=2 x fsdp=2): losses within 9e-8 relative of
one device's, final parameters within 0.025 of the tolerance.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import trainrun
from trainrun import run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")

OVERRIDES = [
    "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.seq_len=32",
    "train.steps=20", "train.batch_size=8", "train.microbatches=2", "train.lr=0.002", "train.warmup_steps=5",
    # Below the early gradient norms, so clipping is exercised (checked below).
    "train.grad_clip=0.5", "train.eval_every=10", "train.eval_batches=1",
    "data.path=/usr/share/games/fortunes", "data.synthetic=false", "runtime.deterministic=true", "seed=7",
    "runtime.cpu_devices=4",
]


def train(tmp, name: str, *extra: str) -> dict:
    return trainrun.train(tmp / name, "configs/test.yml", *OVERRIDES, *extra)


PER_LAYER = ["sched.optimizer=per_layer", "train.grad_clip=0"]
RUN_ARGS = {
    "one": [], "data2": ["parallel.data=2"],
    "data4": ["parallel.data=4", "sched.grad_reduce=bucketed"],
    # per-layer updates: each instance's all-reduce, then its AdamW, inside the backward
    "one_per_layer": PER_LAYER, "data2_per_layer": ["parallel.data=2", *PER_LAYER],
    # FSDP with the default policies (gather_prefetch=1, reshard_after_forward=true),
    # fsdp=4 with the other gather placement
    "fsdp2": ["parallel.fsdp=2"],
    "fsdp4": ["parallel.fsdp=4", "sched.gather_prefetch=2", "sched.reshard_after_forward=false"],
    "data2_fsdp2": ["parallel.data=2", "parallel.fsdp=2"],
    # per-layer updates on fsdp blocks: each instance's AdamW after its last reduce-scatter
    "fsdp2_per_layer": ["parallel.fsdp=2", *PER_LAYER],
}


class Runs(dict):
    """Each run trained when a test first asks for it, so the runs only the
    long tests read (the per-layer ones: make test-long) cost make test
    nothing."""

    def __init__(self, tmp) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, name: str) -> dict:
        self[name] = train(self.tmp, name, *RUN_ARGS[name])
        return self[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not os.path.exists(STRATA):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    return Runs(tmp_path_factory.mktemp("dp"))


def params(r: dict) -> dict:
    from safetensors.numpy import load_file
    return load_file(str(r["dir"] / "params.safetensors"))


BASE = {"data2": "one", "data4": "one", "data2_per_layer": "one_per_layer",
        "fsdp2": "one", "fsdp4": "one", "data2_fsdp2": "one", "fsdp2_per_layer": "one_per_layer"}
# The per-layer optimizer's meshes run in make test-long (tests/README.md); make test keeps
# per-layer updates on a mesh against one device in test_tensor_train.py (fsdp x tensor).
MESHES = [pytest.param(m, marks=pytest.mark.long) if m.endswith("_per_layer") else m for m in sorted(BASE)]
MESH = {"data2": (2, 1), "data4": (4, 1), "data2_per_layer": (2, 1), "fsdp2": (1, 2), "fsdp4": (1, 4),
        "data2_fsdp2": (2, 2), "fsdp2_per_layer": (1, 2)}  # (data, fsdp)


@pytest.mark.parametrize("mesh", MESHES)
def test_losses_match_one_device_every_step(runs: dict, mesh: str) -> None:
    base = runs[BASE[mesh]]
    ours = [m["loss"] for m in runs[mesh]["steps"]]
    one = [m["loss"] for m in base["steps"]]
    assert len(ours) == len(one) == 20
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, one))
    print(f"{mesh}: max relative loss difference over 20 steps: {worst:.3e}")
    np.testing.assert_allclose(ours, one, rtol=1e-5)
    np.testing.assert_allclose([m["eval_loss"] for m in runs[mesh]["evals"]],
                               [m["eval_loss"] for m in base["evals"]], rtol=1e-5)
    # The reported norm is the global one, 1/data included. With clipping
    # active and Adam, a wrong gradient scale barely moves the losses (both
    # are nearly scale-invariant), so this is where a lost 1/data shows.
    np.testing.assert_allclose([m["grad_norm"] for m in runs[mesh]["steps"]],
                               [m["grad_norm"] for m in base["steps"]], rtol=1e-4)


def test_clipping_was_active(runs: dict) -> None:
    norms = [m["grad_norm"] for m in runs["one"]["steps"]]
    assert any(n > 0.5 for n in norms), f"grad_clip=0.5 never engaged: {norms}"


@pytest.mark.parametrize("mesh", MESHES)
def test_final_parameters_match_one_device(runs: dict, mesh: str) -> None:
    ours, one = params(runs[mesh]), params(runs[BASE[mesh]])
    assert sorted(ours) == sorted(one)
    worst = max(float(np.max(np.abs(ours[n] - one[n]) / (1e-5 + 1e-3 * np.abs(one[n])))) for n in one)
    print(f"{mesh}: worst parameter difference as a fraction of the tolerance: {worst:.3f}")
    for name in sorted(one):
        np.testing.assert_allclose(ours[name], one[name], rtol=1e-3, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("mesh", MESHES)
def test_replicas_bitwise_equal(runs: dict, mesh: str) -> None:
    saved = [e for e in runs[mesh]["events"] if e.get("event") == "saved"]
    assert len(saved) == 1, runs[mesh]["events"][-3:]
    n_params = len(params(runs["one"]))
    data, fsdp = MESH[mesh]
    # parameters, m and v: every persistent slot, checked on every device
    # (under fsdp each block against its data replicas; fsdp alone has none)
    assert saved[0].get("replicas_bitwise_equal", 0) == (3 * n_params if data > 1 else 0), saved[0]


@pytest.mark.parametrize("mesh,same", [("fsdp2", "data2"), ("fsdp4", "data4"), ("data2_fsdp2", "data4")])
def test_fsdp_first_loss_bitwise_equal_to_data_parallel(runs: dict, mesh: str, same: str) -> None:
    """Every device takes the same rows under fsdp=F as under data=F and runs
    the same forward programs on parameters that the all-gathers make
    bitwise the whole ones, so the first step's loss (before any update) is
    bitwise that of the data-parallel run. After it they part in the last
    bits (measured: from step 2, 4 or 5 on): data parallelism reads one
    device's f32 norm of the whole all-reduced gradient, fsdp adds its
    devices' block norms on the host in f64, so the clip scale rounds
    differently; still within the tolerances above."""
    ours, theirs = runs[mesh]["steps"], runs[same]["steps"]
    assert ours[0]["loss"] == theirs[0]["loss"]
    np.testing.assert_allclose([m["grad_norm"] for m in ours], [m["grad_norm"] for m in theirs], rtol=1e-5)


@pytest.mark.parametrize("mesh", ["fsdp2", "fsdp4", "data2_fsdp2"])
def test_fsdp_collectives_accounted(runs: dict, mesh: str) -> None:
    """Per step: every COLLECTIVE op of the plan once (metrics count them);
    one reduce-scatter per group instance and microbatch, one data
    all-reduce of the blocks per instance on data=2 x fsdp=2, all-gathers
    as the policy places them; the counted bytes are each collective's
    message per device (the larger of its inputs and outputs: the whole
    tensors of a gather or a scatter), in total and by kind."""
    data, fsdp = MESH[mesh]
    plan = [e for e in runs[mesh]["events"] if e.get("event") == "plan"][0]
    n_inst, micro = 4, 2  # embed, 2 blocks, head
    for m in runs[mesh]["steps"]:
        assert m["devices"] == data * fsdp, m
        assert m["collectives"] == plan["op_counts"]["COLLECTIVE"], (m, plan["op_counts"])
    assert f"fsdp={fsdp} gather_prefetch=" in plan["policy"], plan["policy"]
    p = plan_of(mesh)
    colls = [o for o in p["ops"] if o["kind"] == "COLLECTIVE"]
    rs = [o for o in colls if o["program"].endswith("_fsdp_reduce_scatter")]
    ar = [o for o in colls if o["program"].endswith("_data_all_reduce")]
    ag = [o for o in colls if o["program"].endswith("_fsdp_all_gather")]
    assert len(rs) == n_inst * micro and len(ar) == (n_inst if data > 1 else 0) and len(ag) + len(rs) + len(ar) == len(colls)
    assert len(colls) == plan["op_counts"]["COLLECTIVE"]
    def message(o: dict) -> int:
        return max(sum(p["slots"][i]["bytes"] for i in o["inputs"]), sum(p["slots"][i]["bytes"] for i in o["outputs"]))

    by_kind = {k: {"count": len(v), "bytes": sum(message(o) for o in v)}
               for k, v in (("all_gather", ag), ("reduce_scatter", rs), ("all_reduce", ar)) if v}
    assert all(o["collective_kind"] == k for k, v in (("all_gather", ag), ("reduce_scatter", rs), ("all_reduce", ar))
               for o in v)
    for m in runs[mesh]["steps"]:
        assert m["collective_bytes"] == sum(message(o) for o in colls), m
        assert m["collectives_by_kind"] == by_kind, (m["collectives_by_kind"], by_kind)


PLAN_EXTRA = {"fsdp2": ["parallel.fsdp=2"],
              "fsdp4": ["parallel.fsdp=4", "sched.gather_prefetch=2", "sched.reshard_after_forward=false"],
              "data2_fsdp2": ["parallel.data=2", "parallel.fsdp=2"]}


def plan_of(mesh: str) -> dict:
    out = run([STRATA, "plan", "--json", "configs/test.yml", *OVERRIDES, *PLAN_EXTRA[mesh]]).stdout
    return json.loads(out)["step"]


@pytest.mark.parametrize("mesh,devices", [("data2", 2), ("data4", 4)])
def test_collectives_accounted(runs: dict, mesh: str, devices: int) -> None:
    n_layers = 2
    grad_bytes = sum(v.nbytes for v in params(runs["one"]).values())
    for m in runs[mesh]["steps"]:
        assert m["devices"] == devices
        # one all-reduce per group instance: embed, each block, head
        assert m["collectives"] == n_layers + 2, m
        assert m["collective_bytes"] == grad_bytes, m
        assert m["collectives_by_kind"] == {"all_reduce": {"count": n_layers + 2, "bytes": grad_bytes}}, m
        assert m["collective_s"] >= 0
    # Timestamps come from completion callbacks, so one step's collectives
    # can all be clamped to zero length; over 20 steps they are not.
    assert sum(m["collective_s"] for m in runs[mesh]["steps"]) > 0
    plan = [e for e in runs[mesh]["events"] if e.get("event") == "plan"][0]
    assert plan["op_counts"]["COLLECTIVE"] == n_layers + 2
    assert ("grad_reduce=bucketed" in plan["policy"]) == (mesh == "data4")
    assert "collectives" not in runs["one"]["steps"][0]


# --- the plan -----------------------------------------------------------------

def plan(*extra: str) -> dict:
    out = run([STRATA, "plan", "--json", "configs/test.yml", *OVERRIDES, "model.n_layers=3", *extra]).stdout
    return json.loads(out)["step"]


def test_per_layer_reduce_overlaps_the_next_backward() -> None:
    """grad_reduce=per_layer: layer l's all-reduce is issued right after its
    gradient is final in the last microbatch, before layer l-1's backward."""
    p = plan("parallel.data=2")
    ops = p["ops"]
    last = max(o["micro"] for o in ops if o.get("program") == "block_bwd_res")
    coll = {o["layer"]: i for i, o in enumerate(ops) if o["kind"] == "COLLECTIVE" and o["program"].startswith("block")}
    bwd = {o["layer"]: i for i, o in enumerate(ops)
           if o["kind"] == "LAUNCH" and o["micro"] == last and o["program"] == "block_bwd_res"}
    assert sorted(coll) == sorted(bwd) == [0, 1, 2]
    for l in (2, 1):
        assert bwd[l] < coll[l] < bwd[l - 1], (l, bwd, coll)
    # the head's reduction comes before any block's backward, the embedding's after all
    heads = [i for i, o in enumerate(ops) if o["kind"] == "COLLECTIVE" and o["program"].startswith("head")]
    embeds = [i for i, o in enumerate(ops) if o["kind"] == "COLLECTIVE" and o["program"].startswith("embed")]
    assert len(heads) == len(embeds) == 1 and heads[0] < bwd[2] and embeds[0] > bwd[0]
    assert p["policy"].endswith("data=2 grad_reduce=per_layer")
    assert p["devices"] == 2
    layouts = {s["name"]: s["layout"] for s in p["slots"]}
    assert layouts["wte"] == "replicated" and layouts["grad:wte"] == "partial" and layouts["tokens[0]"] == "split"


def test_bucketed_reduce_after_the_backward() -> None:
    p = plan("parallel.data=2", "sched.grad_reduce=bucketed")
    ops = p["ops"]
    last_bwd = max(i for i, o in enumerate(ops) if o["kind"] == "LAUNCH" and o["program"] == "embed_bwd")
    coll = [i for i, o in enumerate(ops) if o["kind"] == "COLLECTIVE"]
    assert len(coll) == 5 and min(coll) > last_bwd
    assert "grad_reduce=bucketed grad_bucket_bytes=0" in p["policy"]
    # A bucket of one block's gradient bytes: issued as each block's (and the head's with it) fills it.
    one_block = sum(s["bytes"] for s in p["slots"] if s["name"].startswith("layers.0."))
    p = plan("parallel.data=2", "sched.grad_reduce=bucketed", f"sched.grad_bucket_bytes={one_block}")
    ops = p["ops"]
    last_bwd = max(i for i, o in enumerate(ops) if o["kind"] == "LAUNCH" and o["program"] == "embed_bwd")
    coll = [i for i, o in enumerate(ops) if o["kind"] == "COLLECTIVE"]
    assert len(coll) == 5 and min(coll) < last_bwd


def test_one_device_plan_has_no_collective() -> None:
    p = plan()
    assert all(o["kind"] != "COLLECTIVE" for o in p["ops"])
    assert "devices" not in p and "grad_reduce" not in p["policy"]


def test_resume_on_the_same_mesh_is_bitwise(tmp_path) -> None:
    """A checkpoint restores every device's replica (st_executor_put copies
    device 0's value to the others): resuming a data=2 run at step 3 gives
    the uninterrupted run's losses bit for bit, and the replicas still agree."""
    args = ["configs/test.yml", *OVERRIDES, "parallel.data=2", "train.steps=6", "ckpt.every=3"]
    run([STRATA, "train", *args, f"run.dir={tmp_path / 'whole'}"])
    run([STRATA, "train", *args, "train.steps=3", f"run.dir={tmp_path / 'cut'}"])
    run([STRATA, "resume", str(tmp_path / "cut"), "train.steps=6"])

    def losses(d):
        return [json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]

    assert losses(tmp_path / "cut") == losses(tmp_path / "whole")
    assert len(losses(tmp_path / "whole")) == 6
    saved = [json.loads(x) for x in (tmp_path / "cut" / "events.jsonl").read_text().splitlines()]
    assert [e for e in saved if e.get("event") == "saved"][-1]["replicas_bitwise_equal"] > 0
