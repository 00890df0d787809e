"""Pipeline parallelism as plans (docs/parallelism.md, "Pipeline"): strata's
trainer with parallel.pipeline = 2 and 4 under each schedule (GPipe, 1F1B,
interleaved with 2 chunks per stage on 8 layers), 4 and 8 microbatches, tied
and untied embeddings, remat, offload with per-layer updates, pipeline=2 x data=2, pipeline=2 x fsdp=2 (tied:
the wte gathered and sent to the head) and pipeline=2 x data=2 x tensor=2 (8
CPU devices), against the same config on one device. 20 steps, f32, clipping
active. Every run has 2 rows a microbatch, so they share one bundle per mesh
(a test's cost is mostly exports and compiles).

A pipeline without another axis runs the very programs of one device on the
same rows, each gradient accumulated over the microbatches in the same order
(every stage runs its backwards in microbatch order), the clip norm summed on
the host in the same instance order: its losses and parameters are required
to be BITWISE equal to one device's, which is stronger than the issue's
rtol 1e-5 / 1e-3. Another axis inside the stages (data, fsdp: rows summed in
another order; tensor: split matmuls) changes the order of f32 sums, so
there the tolerances hold: losses rtol 1e-5, parameters rtol 1e-3 / atol
1e-5.

The memory test reads the plans (strata plan --json): on P=4, M=8 the first
stage of 1F1B holds P microbatches' activations at its peak and GPipe's M,
and the executor accounts exactly what the plan predicts, per stage and
category (the runs' metrics).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import trainrun
from trainrun import run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")

OVERRIDES = [
    "model.n_layers=8", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.seq_len=32",
    "train.steps=20", "train.batch_size=8", "train.lr=0.002", "train.warmup_steps=5",
    # Below the early gradient norms, so clipping is exercised (checked below).
    "train.grad_clip=0.5", "train.eval_every=10", "train.eval_batches=1",
    "data.path=/usr/share/games/fortunes", "data.synthetic=false", "runtime.deterministic=true", "seed=7",
    "runtime.cpu_devices=4", "sched.remat=none",
]


def train(tmp, name: str, *extra: str) -> dict:
    return trainrun.train(tmp / name, "configs/test.yml", *OVERRIDES, *extra)


# Offload of parameters and optimizer state, and per-layer updates (no clipping), inside the stages.
POLICIES = ["sched.offload=both", "sched.prefetch_depth=2", "sched.optimizer=per_layer", "train.grad_clip=0"]

# name: (base, extra overrides); the base is the one-device run with the same microbatches and embeddings
RUNS = {
    "one_m4": (None, ["train.microbatches=4"]),
    "one_m8": (None, ["train.microbatches=8", "train.batch_size=16"]),
    "one_m4_untied": (None, ["train.microbatches=4", "model.tie_embeddings=false"]),
    "one_m4_remat": (None, ["train.microbatches=4", "sched.remat=every:2"]),
    "one_m4_policies": (None, ["train.microbatches=4", *POLICIES]),
    "p2_gpipe_m4": ("one_m4", ["train.microbatches=4", "parallel.pipeline=2", "sched.pipeline_schedule=gpipe"]),
    "p2_1f1b_m4": ("one_m4", ["train.microbatches=4", "parallel.pipeline=2"]),
    "p2_inter_m4": ("one_m4", ["train.microbatches=4", "parallel.pipeline=2", "sched.pipeline_schedule=interleaved",
                               "sched.pipeline_virtual=2"]),
    "p2_1f1b_m4_remat": ("one_m4_remat", ["train.microbatches=4", "parallel.pipeline=2", "sched.remat=every:2"]),
    "p2_1f1b_m4_policies": ("one_m4_policies", ["train.microbatches=4", "parallel.pipeline=2", *POLICIES]),
    "p2_1f1b_m4_untied": ("one_m4_untied", ["train.microbatches=4", "parallel.pipeline=2",
                                            "model.tie_embeddings=false"]),
    "p4_1f1b_m8": ("one_m8", ["train.microbatches=8", "train.batch_size=16", "parallel.pipeline=4"]),
    "p4_gpipe_m8": ("one_m8", ["train.microbatches=8", "train.batch_size=16", "parallel.pipeline=4",
                               "sched.pipeline_schedule=gpipe"]),
    "p4_inter_m8": ("one_m8", ["train.microbatches=8", "train.batch_size=16", "parallel.pipeline=4",
                               "sched.pipeline_schedule=interleaved", "sched.pipeline_virtual=2"]),
    "p2_data2_m4": ("one_m4", ["train.microbatches=4", "parallel.pipeline=2", "parallel.data=2"]),
    "p2_fsdp2_m4": ("one_m4", ["train.microbatches=4", "parallel.pipeline=2", "parallel.fsdp=2"]),
    "p2_data2_tensor2_m4": ("one_m4", ["train.microbatches=4", "parallel.pipeline=2", "parallel.data=2",
                                       "parallel.tensor=2", "runtime.cpu_devices=8"]),
}
# Another axis inside the stages splits rows or matmuls: the f32 sums run in another order.
SPLIT = ("parallel.data=2", "parallel.fsdp=2", "parallel.tensor=2")
BITWISE = [n for n, (base, extra) in RUNS.items() if base and not any(a in extra for a in SPLIT)]
TOLERANCE = [n for n, (base, extra) in RUNS.items() if base and any(a in extra for a in SPLIT)]


# make test compares these (and trains them and their bases); the other
# schedules, policies and meshes of RUNS are make test-long's (tests/README.md).
QUICK = ("p2_1f1b_m4", "p2_inter_m4", "p4_1f1b_m8", "p2_fsdp2_m4")


def _quick(names: list[str]) -> list:
    return [n if n in QUICK else pytest.param(n, marks=pytest.mark.long) for n in names]


class _Runs(dict):
    """RUNS trained on first use, so that a deselected comparison trains nothing."""

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, name: str) -> dict:
        self[name] = train(self.tmp, name, *RUNS[name][1])
        return self[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not os.path.exists(STRATA):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    return _Runs(tmp_path_factory.mktemp("pipe"))


def params(r: dict) -> dict:
    from safetensors.numpy import load_file
    return load_file(str(r["dir"] / "params.safetensors"))


@pytest.mark.parametrize("name", _quick(BITWISE))
def test_pipeline_is_bitwise_one_device(runs: dict, name: str) -> None:
    ours, base = runs[name], runs[RUNS[name][0]]
    assert len(ours["steps"]) == len(base["steps"]) == 20
    assert [m["loss"] for m in ours["steps"]] == [m["loss"] for m in base["steps"]]
    assert [m["grad_norm"] for m in ours["steps"]] == [m["grad_norm"] for m in base["steps"]]
    assert [m["eval_loss"] for m in ours["evals"]] == [m["eval_loss"] for m in base["evals"]]
    a, b = params(ours), params(base)
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


@pytest.mark.parametrize("name", _quick(TOLERANCE))
def test_pipeline_with_data_matches_one_device(runs: dict, name: str) -> None:
    ours, base = runs[name], runs[RUNS[name][0]]
    np.testing.assert_allclose([m["loss"] for m in ours["steps"]], [m["loss"] for m in base["steps"]], rtol=1e-5)
    np.testing.assert_allclose([m["eval_loss"] for m in ours["evals"]], [m["eval_loss"] for m in base["evals"]],
                               rtol=1e-5)
    a, b = params(ours), params(base)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-3, atol=1e-5, err_msg=k)


def test_clipping_was_active(runs: dict) -> None:
    norms = [m["grad_norm"] for m in runs["one_m4"]["steps"]]
    assert max(norms) > 0.5, norms


@pytest.mark.parametrize("name", _quick(BITWISE + TOLERANCE))
def test_accounting_matches_the_plan_per_stage(runs: dict, name: str) -> None:
    for m in runs[name]["steps"]:
        assert m["live_mismatch_op"] == -1
        p = m["pipeline"]
        assert p["sends"] > 0 and p["send_bytes"] > 0
        for st in p["stage"]:
            assert st["peak_by_category"] == st["peak_by_category_predicted"]
            assert st["busy_s"] > 0
        assert 0 <= p["bubble"] < 1 and 0 <= p["bubble_replayed"] < 1


def plan_json(*extra: str) -> dict:
    r = run([STRATA, "plan", "--json", "configs/test.yml", *OVERRIDES, *extra])
    return json.loads(r.stdout)["step"]


def test_activation_memory_follows_the_schedule() -> None:
    """P=4, M=8, two layers a stage: stage s's activation peak is k x A + T,
    with A one microbatch's activations held between its forward and
    backward (the inputs and residuals of the stage's layers, read from the
    plan's slots), k = P - s for 1F1B (the first stage: P) and M for GPipe,
    and T, what a backward or a forward in flight adds, less than A."""
    extra = ["train.microbatches=8", "train.batch_size=16", "parallel.pipeline=4"]
    peaks = {}
    held = {}
    for sched in ("1f1b", "gpipe"):
        j = plan_json(*extra, f"sched.pipeline_schedule={sched}")
        peaks[sched] = [s["activations"] for s in j["stage_peak_by_category"]]
        m0 = [s for s in j["slots"] if s["category"] == "activations" and s["name"].endswith("/m0")]
        held[sched] = {}
        for st in range(4):
            mine = [s for s in m0 if s.get("stage") == st]
            layers = {s["name"][4:s["name"].index("]")] for s in mine if s["name"].startswith("res[")}
            held[sched][st] = sum(s["bytes"] for s in mine if s["name"].startswith("res[")
                                  or (s["name"].startswith("x[") and s["name"][2:s["name"].index("]")] in layers))
            assert len(layers) == 2, (st, layers)
    assert held["1f1b"] == held["gpipe"]
    P, M = 4, 8
    for st in range(4):  # P - s microbatches (1F1B), M (GPipe), and less than one more
        A_s = held["1f1b"][st]
        assert A_s > 0
        assert 0 <= peaks["1f1b"][st] - (P - st) * A_s < A_s, (st, peaks, A_s)
        assert 0 <= peaks["gpipe"][st] - M * A_s < A_s, (st, peaks, A_s)


def test_predicted_bubble_against_theory() -> None:
    """The plan's simulated 1F1B schedule (strata plan --explain --json), P=4,
    M=8 on the 8-layer model (two layers a stage), each task's time from its
    programs' FLOPs. Theory, (P-1)/(M+P-1), is for equal stages (and then
    the simulation gives it exactly: tests/c/test_pipeline.c); here the head
    adds 0.65 of a block to the last stage, and the bubble must lie between
    the theory and the bubble of every stage as slow as the slowest,
    1 - sum(busy) / (P (M+P-1) max(busy)/M), which meet for equal stages.
    What the CPU devices measure is another matter (docs/parallelism.md,
    "Pipeline": two cores shared by the devices)."""
    r = run([STRATA, "plan", "--explain", "--json", "configs/test.yml", *OVERRIDES, "train.microbatches=8",
             "train.batch_size=16", "parallel.pipeline=4"])
    p = json.loads(r.stdout)["explain"]["pipeline"]
    P, M = 4, 8
    busy = [s["predicted_busy"] for s in p["stage"]]
    assert p["theory_bubble"] == pytest.approx((P - 1) / (M + P - 1))
    slowest = 1 - sum(busy) / (P * (M + P - 1) * max(busy) / M)
    assert p["theory_bubble"] - 1e-9 <= p["predicted_bubble"] <= slowest + 1e-9, (p["predicted_bubble"], busy)
    assert busy[0] == pytest.approx(busy[1], rel=1e-3) == pytest.approx(busy[2], rel=1e-3)  # equal blocks

# Each validation rule: exit 2 and its message (sources of keys set here read "command line").
BAD = [
    (["parallel.pipeline=2", "train.microbatches=1", "train.batch_size=4"],
     "train.microbatches=1 (command line) is less than parallel.pipeline=2 (command line): every stage needs a "
     "microbatch of its own in flight; set train.microbatches to 2 or more"),
    (["parallel.pipeline=2", "sched.pipeline_schedule=interleaved", "sched.pipeline_virtual=1", "train.microbatches=2"],
     "sched.pipeline_schedule=interleaved (command line) needs sched.pipeline_virtual of 2 or more (1, command line): "
     "the model chunks each stage holds"),
    (["parallel.pipeline=2", "sched.pipeline_schedule=1f1b", "sched.pipeline_virtual=2"],
     "sched.pipeline_virtual=2 (command line) with sched.pipeline_schedule=1f1b (command line): model chunks per stage "
     "are for the interleaved schedule; set sched.pipeline_schedule=interleaved or sched.pipeline_virtual=1"),
    (["parallel.pipeline=2", "sched.pipeline_schedule=interleaved", "sched.pipeline_virtual=2", "train.microbatches=3",
      "train.batch_size=6"],
     "sched.pipeline_schedule=interleaved (command line) needs train.microbatches (3, command line) divisible by "
     "parallel.pipeline (2, command line): microbatches go through the chunks in groups of one per stage"),
    (["model.n_layers=3", "parallel.pipeline=2", "sched.pipeline_schedule=interleaved", "sched.pipeline_virtual=2",
      "train.microbatches=2"],
     "model.n_layers=3 (command line) is fewer than parallel.pipeline x sched.pipeline_virtual = 2 x 2 = 4: every "
     "stage chunk needs at least one layer"),
    (["parallel.pipeline=4", "parallel.data=1", "parallel.fsdp=1", "parallel.tensor=1", "runtime.cpu_devices=2",
      "train.microbatches=4"],
     "parallel.pipeline x parallel.data x parallel.fsdp x parallel.tensor = 4 x 1 x 1 x 1 = 4 devices (command line, "
     "command line, command line, command line), but runtime.cpu_devices is 2 (command line)"),
    (["model.n_layers=2", "parallel.pipeline=2", "parallel.pipeline_layers=[1,2]", "train.microbatches=2"],
     "parallel.pipeline_layers (command line) sums to 3 layers, but model.n_layers is 2 (command line)"),
    (["parallel.pipeline=1", "parallel.pipeline_layers=[1,1]"],
     "parallel.pipeline_layers (command line) splits the layers into stages, but parallel.pipeline is 1 (command "
     "line): set parallel.pipeline to the stage count or leave parallel.pipeline_layers empty"),
    (["parallel.pipeline=2", "parallel.pipeline_layers=[2]", "train.microbatches=2"],
     "parallel.pipeline_layers (command line) has 1 entries; it needs one per stage chunk, parallel.pipeline x "
     "sched.pipeline_virtual = 2 (or leave it empty to balance the stages)"),
    (["model.n_layers=2", "parallel.pipeline=2", "parallel.pipeline_layers=[0,2]", "train.microbatches=2"],
     "parallel.pipeline_layers (command line): entry 1 '0' is not a layer count from 1 to model.n_layers (2)"),
]


@pytest.mark.parametrize("extra,message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_pipeline_config_exits_2(extra: list[str], message: str) -> None:
    r = subprocess.run([STRATA, "plan", "configs/test.yml", *extra], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"strata: config error: {message}", r.stderr


# Checkpoints across meshes (issue 27, deliverable 7): a pipeline's checkpoint holds every tensor whole,
# so it resumes on any mesh; cut at step 3 of 6 and resumed.
CKPT_MESHES = {"one": [], "p2": ["parallel.pipeline=2"], "p4": ["parallel.pipeline=4"], "f2": ["parallel.fsdp=2"]}
CKPT_CASES = [("p4", "one"), ("p2", "f2"), ("one", "p2")]
CKPT_OVERRIDES = ["train.microbatches=4", "ckpt.every=3", "ckpt.async=false", "train.eval_every=0"]


def mesh_args(mesh: str) -> list[str]:
    # every axis: a resumed run's config.yaml holds the saving mesh
    base = {"parallel.pipeline": "1", "parallel.fsdp": "1"}
    for kv in CKPT_MESHES[mesh]:
        k, v = kv.split("=")
        base[k] = v
    return [f"{k}={v}" for k, v in base.items()]


def mesh_record(mesh: str) -> dict:
    stages = {"p2": 2, "p4": 4}.get(mesh, 1)
    fsdp = 2 if mesh == "f2" else 1
    r = {"data": 1, "fsdp": fsdp, "tensor": 1, "devices": stages * fsdp}
    if stages > 1:
        r["pipeline"] = stages
    return r


def step_losses(d) -> dict[int, float]:
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m["loss"] for m in lines if "loss" in m}


@pytest.fixture(scope="module")
def ckpt_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("pipe_ckpt")
    out = {"tmp": tmp}
    for mesh in sorted({m for case in CKPT_CASES for m in case}):
        whole = tmp / f"whole_{mesh}"
        run([STRATA, "train", "configs/test.yml", *OVERRIDES, *CKPT_OVERRIDES, *mesh_args(mesh), "train.steps=6",
             f"run.dir={whole}"])
        out[f"whole_{mesh}"] = whole
    for saved in sorted({s for s, _ in CKPT_CASES}):
        cut = tmp / f"cut_{saved}"
        run([STRATA, "train", "configs/test.yml", *OVERRIDES, *CKPT_OVERRIDES, *mesh_args(saved), "train.steps=3",
             f"run.dir={cut}"])
        out[f"cut_{saved}"] = cut
    return out


@pytest.mark.parametrize("saved,on", CKPT_CASES)
def test_pipeline_checkpoint_resumes_on_another_mesh(ckpt_runs: dict, saved: str, on: str) -> None:
    import shutil
    dst = ckpt_runs["tmp"] / f"from_{saved}_on_{on}"
    shutil.copytree(ckpt_runs[f"cut_{saved}"], dst)
    r = run([STRATA, "resume", str(dst), "train.steps=6", *mesh_args(on)])
    m = json.loads((ckpt_runs[f"cut_{saved}"] / "checkpoints" / "step_3" / "manifest.json").read_text())
    assert m["mesh"] == mesh_record(saved)
    assert {t["layout"] for t in m["tensors"]} == {"whole"}
    events = [json.loads(x) for x in (dst / "events.jsonl").read_text().splitlines()]
    resumed = [e for e in events if e.get("event") == "resumed"][-1]
    assert resumed["from_step"] == 3 and resumed["mesh"] == mesh_record(on)
    got, whole = step_losses(dst), step_losses(ckpt_runs[f"whole_{saved}"])
    assert sorted(got) == list(range(1, 7))
    after = [got[s] for s in range(4, 7)]
    ref = [whole[s] for s in range(4, 7)]
    if "f2" in (saved, on):  # fsdp sums rows in another order
        np.testing.assert_allclose(after, ref, rtol=1e-5, atol=0)
        assert "written on mesh" in r.stderr
    else:  # a pipeline computes what one device does: the resume continues bitwise
        assert after == ref
    if saved != on:
        assert "pipeline=" in r.stderr, r.stderr
    m2 = json.loads((dst / "checkpoints" / "step_6" / "manifest.json").read_text())
    assert m2["mesh"] == mesh_record(on)


def test_eval_and_sample_of_a_pipeline_run_use_one_device(runs: dict) -> None:
    """strata eval and strata sample read a pipeline run's whole tensors on one
    device: the evaluation of P=4's parameters equals that of one device's
    (the parameters are bitwise equal, test_pipeline_is_bitwise_one_device)."""
    def eval_loss(d) -> float:
        run([STRATA, "eval", str(d)])
        (f,) = sorted((d / "eval").glob("*.json"))
        return json.loads(f.read_text())["loss"]
    assert eval_loss(runs["p4_1f1b_m8"]["dir"]) == eval_loss(runs["one_m8"]["dir"])
    # bytes: a byte-level model's text need not be UTF-8
    r = subprocess.run([STRATA, "sample", str(runs["p4_1f1b_m8"]["dir"]), "--tokens", "4", "--prompt", "The "],
                       cwd=ROOT, capture_output=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(b"The ")


def test_explain_draws_the_schedule() -> None:
    """strata plan --explain (text): the stage table, one grid row a stage
    with every microbatch's forward and backward, the bubble line."""
    r = run([STRATA, "plan", "--explain", "configs/test.yml", *OVERRIDES, "train.microbatches=4",
             "parallel.pipeline=2", "sched.pipeline_schedule=gpipe"])
    out = r.stdout
    assert "; per pipeline stage: 2 stages, each on a mesh of its own (2 devices in all)" in out
    assert "# pipeline: 2 stages x 1 chunk(s), 4 microbatches" in out
    rows = [line for line in out.splitlines() if line.startswith("  stage ") and "|" in line]
    assert len(rows) == 2
    for row in rows:
        for m in range(4):
            assert f"F{m}" in row and f"B{m}" in row, row
    # GPipe: every forward before the first backward on each stage
    assert all(row.index("F3") < row.index("B0") for row in rows)
    assert "# predicted bubble " in out and "theory for equal stages 0.2000" in out
