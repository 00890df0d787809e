"""The optimizer registry (issue 29, docs/model.md "Optimizers") against optax.

For each optimizer: 20 steps of the registry's update (the arithmetic of the
exported update_<group> programs, optimizers.group_update) and of optax's
equivalent on the same gradients, the parameters compared at rtol 1e-3 /
atol 1e-5; with the model (the JAX reference's train step on its batches,
and an optax-driven loop on the same batches) the losses too, at rtol 1e-5.
Where optax's definition differs from strata's the optax side is built with
strata's (docs/model.md, "Optimizers", "optax"):
- SGD: optax.sgd has no weight decay: trace, then add_decayed_weights, then
  the lr (decoupled decay, as AdamW's).
- Adafactor: optax.adafactor applies weight_decay_rate after the lr (p -= lr u
  + wd p) and defaults to min_dim_size_to_factor 128 and
  multiply_by_parameter_scale: here min_dim_size_to_factor 0, no parameter
  scale, and the decay added before the lr (p -= lr (u + wd p)).
- Muon: optax.contrib.muon on the hidden matrices (rank 2, outside embed and
  head) with beta = train.momentum, optax.adamw on the rest, through
  optax.multi_transform; decay on every rank >= 2 parameter.
- The lr: optax reads its schedule at its count (0 on the first update),
  strata at t = count + 1: the schedule given to optax is lr_at(count + 1).
Also: without the optimizer object the programs are today's; with one, an
all-AdamW group's update_<group> lowers to adamw_<group>'s text; the state
tensors (Adafactor's factored vr/vc) in the exported update programs; the
manifest roles; the assignment's errors.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import tiny_config

from strata_jax import data as D
from strata_jax import export as E
from strata_jax import model as M
from strata_jax import optimizers as O
from strata_jax import programs as PR
from strata_jax import registry as R
from strata_jax import tensor_parallel as TP
from strata_jax import reference_train as RT
from strata_jax.config import ModelConfig, OptimizerSpec
from strata_jax.mesh import MeshSpec
from strata_jax.optim import lr_at

STEPS = 20
CASES: dict[str, OptimizerSpec] = {
    "adamw": OptimizerSpec("adamw", groups=("vectors=adamw",)),
    "sgd": OptimizerSpec("sgd", momentum=0.9),
    "sgd_nesterov": OptimizerSpec("sgd", momentum=0.8, nesterov=True),
    "lion": OptimizerSpec("lion"),
    "adafactor": OptimizerSpec("adafactor"),
    "muon": OptimizerSpec("muon", momentum=0.95),
}


def _cfg(spec: OptimizerSpec | None, **over: Any) -> ModelConfig:
    return ModelConfig.from_dict({**tiny_config()["model"], "tie_embeddings": False, **over,
                                  **({"optimizer": spec.to_json()} if spec is not None else {})})


def _lr_sched(tc: dict[str, Any], steps: int) -> Any:
    table = jnp.asarray([lr_at(t, lr=tc["lr"], min_lr_ratio=tc["min_lr_ratio"], warmup_steps=tc["warmup_steps"],
                               steps=steps) for t in range(1, steps + 1)], jnp.float32)
    return lambda count: table[jnp.minimum(count, steps - 1)]


def _optax_tx(cfg: ModelConfig, tc: dict[str, Any], steps: int, params: Any) -> optax.GradientTransformation:
    """optax's equivalent of cfg's assignment, on the FullParams tree."""
    spec = cfg.optimizer
    assert spec is not None
    sched = _lr_sched(tc, steps)
    b1, b2, eps, wd = tc["beta1"], tc["beta2"], tc["eps"], tc["weight_decay"]
    decay = jax.tree.map(lambda p: p.ndim >= 2, params)
    txs = {
        "adamw": optax.adamw(sched, b1, b2, eps, weight_decay=wd, mask=decay),
        "sgd": optax.chain(optax.trace(spec.momentum, spec.nesterov), optax.add_decayed_weights(wd, decay),
                           optax.scale_by_learning_rate(sched)),
        "lion": optax.lion(sched, b1, b2, weight_decay=wd, mask=decay),
        # optax.adafactor without an lr ends in scale(-1): -u, then -u - wd p, then lr (not flipped).
        "adafactor": optax.chain(
            optax.adafactor(None, min_dim_size_to_factor=0, decay_rate=O.ADAFACTOR_DECAY,
                            multiply_by_parameter_scale=False, clipping_threshold=O.ADAFACTOR_CLIP,
                            eps=O.ADAFACTOR_EPS1),
            optax.add_decayed_weights(-wd, decay), optax.scale_by_learning_rate(sched, flip_sign=False)),
        "muon": optax.contrib.muon(sched, ns_coeffs=O.MUON_NS_COEFFS, ns_steps=O.MUON_NS_STEPS, beta=spec.momentum,
                                   eps=O.MUON_EPS, weight_decay=wd),
    }
    assign = O.assignment(cfg)
    kinds = [k for k in cfg.layer_kinds()]
    labels = {"embed": dict(zip(M.group_param_names(cfg, "embed"), assign["embed"])),
              "blocks": [dict(zip(M.group_param_names(cfg, R.KINDS[k].group_name),
                                  assign[R.KINDS[k].group_name])) for k in kinds],
              "head": dict(zip(M.group_param_names(cfg, "head"), assign["head"]))}
    used = {o for a in assign.values() for o in a}
    return optax.multi_transform({o: txs[o] for o in used}, labels)


def _registry_step(cfg: ModelConfig) -> Any:
    """jit(params, states, grads, step, lr, gscale, hyper) -> (params, states)
    over the group instances (embed, each layer, head), group_update each."""
    assign, c = O.assignment(cfg), O.constants(cfg.optimizer)
    gnames = ["embed"] + [R.KINDS[k].group_name for k in cfg.layer_kinds()] + ["head"]
    layouts = {g: O.state_layout([M.param_shape(cfg, n, g) for n in M.group_param_names(cfg, g)], assign[g], c)
               for g in set(gnames)}

    def step(params: Any, states: Any, grads: Any, t: Any, lr: Any, gscale: Any, hyper: Any) -> Any:
        ps = [params["embed"]] + params["blocks"] + [params["head"]]
        gs = [grads["embed"]] + grads["blocks"] + [grads["head"]]
        ss = [states["embed"]] + states["blocks"] + [states["head"]]
        out_p, out_s = [], []
        for p, g, s, gn in zip(ps, gs, ss, gnames, strict=True):
            names = M.group_param_names(cfg, gn)
            np_, ns = O.group_update(assign[gn], layouts[gn], [p[k] for k in names], [g[k] for k in names], s,
                                     [p[k].ndim >= 2 for k in names], t, lr, gscale, hyper, c)
            out_p.append(dict(zip(names, np_)))
            out_s.append(ns)
        return ({"embed": out_p[0], "blocks": out_p[1:-1], "head": out_p[-1]},
                {"embed": out_s[0], "blocks": out_s[1:-1], "head": out_s[-1]})
    return jax.jit(step)


def _close(a: Any, b: Any, rtol: float = 1e-3, atol: float = 1e-5) -> None:
    fa, fb = M.flatten_params(a), M.flatten_params(b)
    for k in fa:
        np.testing.assert_allclose(np.asarray(fa[k]), np.asarray(fb[k]), rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("case", list(CASES))
def test_update_equals_optax(case: str) -> None:
    """20 steps on random gradients (a real parameter tree, gscale != 1)."""
    cfg = _cfg(CASES[case])
    tc = tiny_config(steps=STEPS)["train"]
    params = M.init_params(cfg, 7)
    states, _ = RT.init_opt_state(cfg, params)
    tx = _optax_tx(cfg, tc, STEPS, params)
    ostate = tx.init(params)
    oparams = params
    ours = _registry_step(cfg)
    hyper = jnp.asarray([tc["beta1"], tc["beta2"], tc["eps"], tc["weight_decay"]], jnp.float32)
    opt_update = jax.jit(tx.update)
    rng = np.random.default_rng(0)
    leaves, tree = jax.tree.flatten(params)
    for t in range(1, STEPS + 1):
        grads = jax.tree.unflatten(tree, [(0.02 * rng.standard_normal(x.shape)).astype(np.float32) for x in leaves])
        gscale = jnp.float32(0.5 + 0.05 * t)
        lr = lr_at(t, lr=tc["lr"], min_lr_ratio=tc["min_lr_ratio"], warmup_steps=tc["warmup_steps"], steps=STEPS)
        params, states = ours(params, states, grads, jnp.float32(t), jnp.float32(lr), gscale, hyper)
        upd, ostate = opt_update(jax.tree.map(lambda g: g * gscale, grads), ostate, oparams)
        oparams = optax.apply_updates(oparams, upd)
    first = M.flatten_params(M.init_params(cfg, 7))
    moved = max(float(jnp.max(jnp.abs(a - first[k]))) for k, a in M.flatten_params(params).items())
    assert moved > 100 * 1e-5, moved  # the parameters moved well beyond atol
    _close(params, oparams)


def _optax_train(config: dict[str, Any], tokens: np.ndarray, steps: int) -> tuple[Any, list[float]]:
    """reference_train's loop with optax's update in place of the registry's."""
    cfg = RT.model_config(config)
    tc = config["train"]
    sampler = RT.make_sampler(config, tokens, cfg, RT.TrainConfig.from_dict({**tc, "steps": steps}))
    params = M.init_params(cfg, int(config["seed"]))
    tx = _optax_tx(cfg, tc, steps, params)
    state = tx.init(params)
    grad_fn = jax.value_and_grad(lambda p, *xs: M.model_objective(cfg, p, *xs), has_aux=True)

    @jax.jit
    def step(params: Any, state: Any, tokens: Any, targets: Any, mask: Any) -> Any:
        def micro(gsum: Any, xs: Any) -> Any:
            (_, (loss, _)), g = grad_fn(params, *xs)
            return jax.tree.map(jnp.add, gsum, g), loss
        grads, losses = jax.lax.scan(micro, jax.tree.map(jnp.zeros_like, params), (tokens, targets, mask))
        total = sum((jnp.sum(g * g) for g in jax.tree.leaves(grads)), start=jnp.float32(0.0))
        _, gscale = RT.norm_and_gscale(cfg, total, mask, tokens.shape[0], jnp.float32(tc["grad_clip"]))
        upd, state = tx.update(jax.tree.map(lambda g: g * gscale, grads), state, params)
        return optax.apply_updates(params, upd), state, losses

    losses = []
    for k in range(steps):
        b = sampler.batch(k)
        params, state, ls = step(params, state, b.tokens, b.targets, b.mask)
        losses.append(RT.host_loss(cfg, np.asarray(ls), b.mask))
    return params, losses


def test_reference_equals_optax_train() -> None:
    """The JAX reference (reference_train.train, train.optimizer=muon: muon on
    the hidden matrices, adamw on the rest; sgd on the norms) against an
    optax-driven loop on the same batches: losses rtol 1e-5, params 1e-3 / 1e-5."""
    config = tiny_config(steps=STEPS)
    spec = OptimizerSpec("muon", momentum=0.95, groups=("vectors=sgd",))
    config["train"].update({"optimizer": spec.default, "momentum": spec.momentum, "nesterov": spec.nesterov,
                            "optimizer_groups": list(spec.groups), "eval_batches": 0})
    tokens = D.synthetic_tokens(64, 4096)
    params, hist = RT.train(config, tokens)
    oparams, olosses = _optax_train(config, tokens, STEPS)
    np.testing.assert_allclose(hist["losses"], olosses, rtol=1e-5)
    assert hist["losses"][-1] < hist["losses"][0]
    _close(params, oparams)


def test_default_programs_unchanged_and_adamw_update_same_text() -> None:
    """No optimizer object: adamw_<group> with m_/v_ inputs (today's); with an
    all-AdamW object, update_<group> lowers to adamw_<group>'s very text but
    for the module's name (its function's)."""
    plain = PR.programs_by_name(_cfg(None))
    assert "adamw_block" in plain and "adamw_stats_block" in plain and not any(n.startswith("update") for n in plain)
    assert [s.role for s in plain["adamw_block"].inputs].count("opt_m") == 9
    obj = PR.programs_by_name(_cfg(CASES["adamw"]))
    assert "adamw_block" not in obj and "update_block" in obj and "update_stats_block" in obj
    a, u = plain["adamw_block"], obj["update_block"]
    assert [(s.name, s.shape, s.role) for s in a.inputs] == [(s.name, s.shape, s.role) for s in u.inputs]
    assert a.donated == u.donated
    ta, tu = E.lower_program(a)[0], E.lower_program(u)[0]
    assert ta.replace("@jit_adamw", "@jit_update") == tu


def test_state_tensors_and_roles() -> None:
    cfg = _cfg(OptimizerSpec("adafactor", groups=("embed=adamw", "head=lion")))
    progs = PR.programs_by_name(cfg)
    upd = progs["update_block"]
    states = [(s.name, s.shape, s.role) for s in upd.inputs if s.role.startswith("opt_")]
    # v for the norms, then vr (the shape without the largest dimension), then vc.
    assert states[:2] == [("v_attn_norm", (32,), "opt_v"), ("v_mlp_norm", (32,), "opt_v")]
    assert ("vr_wq", (32,), "opt_vr") in states and ("vc_wq", (32,), "opt_vc") in states
    assert ("vr_w_up", (32,), "opt_vr") in states and ("vc_w_up", (64,), "opt_vc") in states
    assert ("vr_w_down", (32,), "opt_vr") in states and ("vc_w_down", (64,), "opt_vc") in states
    kinds = [r for _, _, r in states]
    assert kinds == sorted(kinds, key=["opt_v", "opt_vr", "opt_vc"].index)
    n = len(M.group_param_names(cfg, "block"))
    assert [s.name for s in upd.outputs] == [s.name for s in upd.inputs[:n]] + [s[0] for s in states]
    assert upd.donated == tuple(range(n)) + tuple(range(2 * n, 2 * n + len(states)))
    assert [s.name for s in upd.inputs[-4:]] == ["step", "lr", "gscale", "hyper"]
    assert [s.name for s in progs["update_embed"].inputs if s.role.startswith("opt_")] == ["m_wte", "v_wte"]
    assert [s.name for s in progs["update_head"].inputs if s.role.startswith("opt_")] == ["m_final_norm",
                                                                                          "m_w_out"]
    E.lower_program(upd)  # the outputs match the contract
    E.lower_program(progs["update_stats_block"])
    tables = E.program_tables(cfg, set(progs))
    blk = next(g for g in tables["groups"] if g["name"] == "block")
    assert blk["programs"] == {"accum": "accum_block", "sqnorm": "sqnorm_block", "update": "update_block",
                               "update_stats": "update_stats_block"}
    assert O.state_bytes((32, 64), "adafactor") == 4 * (32 + 64) and O.state_bytes((32,), "adafactor") == 128
    assert O.state_bytes((32, 64), "adamw") == 8 * 32 * 64 and O.state_bytes((32, 64), "muon") == 4 * 32 * 64


def test_muon_matrices_and_fsdp_variants() -> None:
    cfg = _cfg(CASES["muon"])
    a = O.assignment(cfg)
    assert a["embed"] == ("adamw",) and set(a["head"]) == {"adamw"}
    blk = dict(zip(M.group_param_names(cfg, "block"), a["block"]))
    assert blk["wq"] == "muon" and blk["attn_norm"] == "adamw"
    E.lower_program(PR.programs_by_name(cfg)["update_block"])
    # Only fsdp across processes is refused: on one process's devices the
    # update gathers (tensor_parallel.whole_update_program, below).
    assert O.unsupported_parallel(cfg, 2) and O.unsupported_parallel(cfg, 1) is None
    f = {p.name: p for p in PR.fsdp_programs(cfg, 2)}
    assert "accum_block_fsdp2" in f and "update_block_fsdp2" not in f and "update_embed_fsdp2" in f
    w = {p.name: p for p in TP.whole_update_programs(cfg, MeshSpec(fsdp=2), E._tp_split_dim)}
    assert set(w) == {"update_block_fsdp2"}
    assert [s.local_shape(w["update_block_fsdp2"].mesh) for s in w["update_block_fsdp2"].inputs[:2]] == [(16,), (16, 32)]
    lion = _cfg(OptimizerSpec("lion", groups=("vectors=sgd",)))
    assert O.unsupported_parallel(lion, 2) is None and not TP.whole_update_programs(lion, MeshSpec(fsdp=2), E._tp_split_dim)
    f = {p.name: p for p in PR.fsdp_programs(lion, 2)}
    u = f["update_embed_fsdp2"]
    assert [(s.name, s.shape) for s in u.inputs if s.role.startswith("opt_")] == [("m_wte", (32, 32))]
    hb = f["update_block_fsdp2"]
    assert ("mom_attn_norm", (16,)) in [(s.name, s.shape) for s in hb.inputs]
    tables = E.program_tables(lion, {p.name for p in PR.build_programs(lion)} | set(f), fsdp=2)
    assert tables["groups"][0]["shard_programs"]["update"] == "update_embed_fsdp2"


# Meshes of the whole-tensor update check: fsdp=3 pads every dimension 0 of
# the tiny model (32, 64 rows), tensor=2 cuts, fsdp=2 x tensor=2 cuts wo's
# and w_down's rows twice over.
WHOLE_MESHES = {"f3": MeshSpec(fsdp=3), "t2": MeshSpec(tensor=2), "f2t2": MeshSpec(fsdp=2, tensor=2)}


@pytest.fixture(scope="module")
def whole_child(request: pytest.FixtureRequest) -> dict[str, dict[str, float]]:
    """The child's errors per mesh and program: make test runs f3 (fsdp with
    padding), make test-long every mesh (test_tensor_parallel.py's way)."""
    expr = request.config.option.markexpr or ""
    meshes = ["f3"] if "not long" in expr else list(WHOLE_MESHES)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--whole-child", ",".join(meshes)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mesh", [m if m == "f3" else pytest.param(m, marks=pytest.mark.long) for m in WHOLE_MESHES])
def test_whole_tensor_updates_on_blocks_equal_the_one_device_update(whole_child: dict, mesh: str) -> None:
    """tensor_parallel.whole_update_program (adafactor for the embedding,
    muon and lion in the block) run by JAX on forced CPU devices: every
    device's output blocks equal the blocks of the one-device update of the
    whole tensors, padding rows zero, factored moments whole everywhere."""
    progs = whole_child[mesh]
    assert progs, mesh
    for name, err in progs.items():
        # The same arithmetic on the same whole tensors, but XLA compiles the
        # SPMD program's copy on its own (fusion, FMA contraction, the
        # Newton-Schulz matmuls' blocking): within a few f32 ulps of the
        # output's largest magnitude. Measured <= 1.05e-7 (about 1 ulp),
        # default and AVX2; the bound is 8 ulps.
        assert err <= 2 ** -20, (mesh, name, err)


def _blocks(x: np.ndarray, d: int | None, mesh: MeshSpec, t: int, f: int) -> np.ndarray:
    """Device (t, f)'s block: the tensor cut along d, then fsdp rows padded."""
    if d is not None and mesh.tensor > 1:
        k = x.shape[d] // mesh.tensor
        x = np.take(x, range(t * k, (t + 1) * k), axis=d)
    if mesh.fsdp > 1 and x.ndim:
        r = PR.shard_shape(x.shape, mesh.fsdp)[0]
        x = np.pad(x, [(0, r * mesh.fsdp - x.shape[0])] + [(0, 0)] * (x.ndim - 1))[f * r:(f + 1) * r]
    return x


def _whole_child() -> None:
    from strata_jax.mesh import make_mesh
    cfg = _cfg(OptimizerSpec("muon", momentum=0.9, groups=("embed=adafactor", "vectors=lion")))
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {}
    for key in sys.argv[sys.argv.index("--whole-child") + 1].split(","):
        mesh = WHOLE_MESHES[key]
        progs = (TP.whole_update_programs(cfg, mesh, E._tp_split_dim) if mesh.fsdp > 1 else
                 [p for p in TP.optimizer_programs(cfg, mesh) if p.name == "tp_update_block"])
        jm = make_mesh(mesh)
        out[key] = {}
        for prog in progs:
            group = "block" if "block" in prog.name else prog.name.split("_")[1]
            names = M.group_param_names(cfg, group)
            shapes = [M.param_shape(cfg, p, group) for p in names]
            dims = [E._tp_split_dim(group, p) for p in names]
            opts = O.assignment(cfg)[group]
            layout = O.state_layout(shapes, opts, O.constants(cfg.optimizer))
            p = [rng.standard_normal(s).astype(np.float32) * 0.1 for s in shapes]
            g = [rng.standard_normal(s).astype(np.float32) * 0.01 for s in shapes]
            st = [np.abs(rng.standard_normal(sl.shape)).astype(np.float32) * 1e-4 for sl in layout]
            sc = [np.float32(3.0), np.float32(0.01), np.float32(0.5), np.array([0.9, 0.95, 1e-8, 0.1], np.float32)]
            decay = [len(s) >= 2 for s in shapes]
            want_p, want_s = jax.jit(lambda p, g, st, *sc: O.group_update(
                opts, layout, p, g, st, decay, *sc, O.constants(cfg.optimizer)))(p, g, st, *sc)
            whole = [sl.shape != shapes[sl.index] for sl in layout]
            per_dev, expect = [], []
            for dev in range(mesh.devices):
                _, f, t = np.unravel_index(dev, mesh.shape)

                def cut(x: Any, i: int) -> np.ndarray:
                    return _blocks(np.asarray(x), dims[i], mesh, t, f)

                per_dev.append([cut(x, i) for i, x in enumerate(p)] + [cut(x, i) for i, x in enumerate(g)]
                               + [np.asarray(x) if w else cut(x, sl.index) for x, sl, w in zip(st, layout, whole)] + sc)
                expect.append([cut(x, i) for i, x in enumerate(want_p)]
                              + [np.asarray(x) if w else cut(x, sl.index) for x, sl, w in zip(want_s, layout, whole)])
            got = prog.run(jm, per_dev)
            err = 0.0
            for gd, ed in zip(got, expect):
                for a, b in zip(gd, ed):
                    assert a.shape == b.shape, (prog.name, a.shape, b.shape)
                    err = max(err, float(np.max(np.abs(a - b), initial=0.0) / max(float(np.max(np.abs(b))), 1e-30)))
            out[key][prog.name] = err
    print(json.dumps(out))


@pytest.mark.parametrize("spec,match", [
    (OptimizerSpec("muon", groups=("embed=muon",)), "not the embed group"),
    (OptimizerSpec("adamw", groups=("blocks=sgd",)), "unknown selector 'blocks'"),
    (OptimizerSpec("adamw", groups=("block",)), "SELECTOR=OPTIMIZER"),
    (OptimizerSpec("adam"), "unknown optimizer 'adam'"),
    (OptimizerSpec("sgd", groups=("vectors=muon",)), "rank 2"),
])
def test_assignment_errors(spec: OptimizerSpec, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _cfg(spec)


def test_model_json_round_trip() -> None:
    cfg = _cfg(OptimizerSpec("sgd", 0.5, True, ("embed=adamw", "head=adamw")))
    d = cfg.to_dict()
    assert d["optimizer"] == {"default": "sgd", "momentum": 0.5, "nesterov": True, "groups": ["embed=adamw",
                                                                                            "head=adamw"]}
    assert ModelConfig.from_dict(d) == cfg
    assert "optimizer" not in _cfg(None).to_dict()
    assert dataclasses.replace(cfg, optimizer=None) == _cfg(None)


if __name__ == "__main__" and "--whole-child" in sys.argv:
    _whole_child()
