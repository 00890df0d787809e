"""Packing on the model side (issue 28; docs/model.md, "Packing"): the
programs' positions input, the segment mask, RoPE and learned positions by
position, and the global loss normalisation of the reference.

The batches here are built by hand (a packed layout of documents, padding
weighted 0); the data side's packer has its own tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from conftest import PY_ENV, ROOT, tiny_config, tiny_model

import jax
import jax.numpy as jnp

from strata_jax import data as D
from strata_jax import model as M
from strata_jax import programs as PR
from strata_jax import registry as R
from strata_jax import reference_train as RT
from strata_jax.config import ModelConfig

T = 16
# Row 0: three documents (5, 7 and 4 tokens); row 1: one of 9, then 7 of padding.
ROWS = ((5, 7, 4), (9, 7))
PADDED_ROW = 1  # the last segment of row 1 is padding


def layout() -> tuple[np.ndarray, list[list[tuple[int, int]]]]:
    """positions [2, T] and, per row, the (start, end) of each segment."""
    pos = np.zeros((len(ROWS), T), np.int32)
    spans = []
    for r, lens in enumerate(ROWS):
        at, row = 0, []
        for n in lens:
            pos[r, at:at + n] = np.arange(n)
            row.append((at, at + n))
            at += n
        assert at == T
        spans.append(row)
    return pos, spans


def stack_cfg(name: str, **over: Any) -> ModelConfig:
    stacks = {"llama": {}, "mixed": {"layers": ["llama", "parallel", "moe"], "n_layers": 3, "n_experts": 4,
                                     "n_kv_heads": 2},
              "gpt2": {"block": "gpt2", "vocab_padded": 80}}
    return ModelConfig.from_dict(tiny_model(**{**stacks[name], **over}))


def tokens_for(cfg: ModelConfig, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (cfg.microbatch_size, T)).astype(np.int32)


# --- the contract: programs of concat unchanged, pack's positions input ----------

def _texts(cfg: ModelConfig) -> dict[str, str]:
    out = {}
    for p in PR.build_programs(cfg):
        jitted = jax.jit(p.fn, donate_argnums=p.donated, keep_unused=True)
        out[p.name] = jitted.lower(*(s.struct() for s in p.inputs)).as_text()
    return out


def test_packing_key_and_what_each_mode_changes() -> None:
    """concat is the default and leaves the model JSON (so the bundle key) as
    it was; none changes head_loss/head_eval only; pack also every program
    that takes positions, and nothing else (same texts). The texts before
    packing existed were diffed against concat's when it was added (every
    program of 8 configs and 3 meshes: identical)."""
    base = tiny_model()
    concat = ModelConfig.from_dict(base)
    assert ModelConfig.from_dict({**base, "packing": "concat"}) == concat
    assert "packing" not in concat.to_dict() and concat.packing == "concat"
    assert ModelConfig.from_dict({**base, "packing": "pack"}).to_dict()["packing"] == "pack"
    with pytest.raises(ValueError, match="packing must be one of concat|none|pack"):
        ModelConfig.from_dict({**base, "packing": "greedy"})
    texts = {mode: _texts(ModelConfig.from_dict({**base, "packing": mode})) for mode in ("concat", "none", "pack")}
    diff = {mode: sorted(n for n in texts["concat"] if texts[mode][n] != texts["concat"][n]) for mode in ("none", "pack")}
    assert diff["none"] == ["head_eval", "head_loss"]
    assert diff["pack"] == sorted(["head_eval", "head_loss", "embed_fwd", "embed_bwd", "block_fwd", "block_bwd",
                                   "block_fwd_res", "block_bwd_res"])
    assert not any("positions" in t for t in texts["concat"].values())


@pytest.mark.parametrize("stack", ["mixed", "gpt2"])
def test_pack_program_signatures(stack: str) -> None:
    cfg = stack_cfg(stack, packing="pack")
    progs = PR.programs_by_name(cfg)
    pos = PR.TensorSpec("positions", (cfg.microbatch_size, T), "s32", "batch")

    def after(name: str, first: str) -> None:
        ins = progs[name].inputs
        i = [s.name for s in ins].index(first)
        assert ins[i + 1] == pos, name
        assert [s.name for s in ins].count("positions") == 1, name

    after("embed_fwd", "tokens")
    after("embed_bwd", "tokens")
    assert progs["embed_bwd"].inputs[-1].name == "dx"
    for kind in R.kinds_of(cfg):
        for role in ("fwd", "bwd", "fwd_res", "bwd_res"):
            after(f"{kind.program_prefix}_{role}", "x")
    # Generation and the head: unchanged.
    for name in ("embed_prefill", "embed_decode", "head_loss", "head_eval", "head_logits"):
        assert all(s.name != "positions" for s in progs[name].inputs), name


# --- the segment mask: no token reads another document ----------------------

# make test: llama at xla (gpt2's learned positions: the packed-document test
# below); gpt2, the mixed stack and pallas (~25 s of interpreted kernels; `strata kernels verify`
# checks the pallas segment form in make test) in make test-long.
LONG = pytest.mark.long
@pytest.mark.parametrize("stack,impl", [
    ("llama", "xla"), pytest.param("gpt2", "xla", marks=LONG), pytest.param("mixed", "xla", marks=LONG),
    pytest.param("llama", "pallas", marks=LONG), pytest.param("mixed", "pallas", marks=LONG),
    pytest.param("gpt2", "pallas", marks=LONG)])
def test_no_token_attends_across_documents(stack: str, impl: str) -> None:
    """Perturbing one document's tokens leaves every other document's logits,
    and every other token's block outputs (block_fwd, block_fwd_res programs),
    bitwise unchanged; the perturbed document's do change."""
    kernels = {} if impl == "xla" else {"kernels": {"attention": impl}}
    cfg = stack_cfg(stack, packing="pack", **kernels)
    params = M.init_params(cfg, 3)
    pos, spans = layout()
    tok = tokens_for(cfg)
    a, b = spans[0][1]  # the middle document of row 0
    tok2 = tok.copy()
    tok2[0, a:b] = (tok2[0, a:b] + 1 + np.arange(b - a)) % cfg.vocab_size
    logits = jax.jit(lambda t, p: M.model_logits(cfg, params, t, p))
    l1, l2 = np.asarray(logits(tok, pos)), np.asarray(logits(tok2, pos))
    others = np.ones((cfg.microbatch_size, T), bool)
    others[0, a:b] = False
    np.testing.assert_array_equal(l1[others], l2[others])
    assert np.all(np.any(l1[0, a:b] != l2[0, a:b], axis=-1))

    # The block programs the trainer runs: each kind's fwd and fwd_res on the
    # embeddings of both token sets (the other documents' rows equal).
    progs = PR.programs_by_name(cfg)
    emb = [params["embed"][n] for n in M.embed_param_names(cfg)]
    x1 = np.asarray(jax.jit(progs["embed_fwd"].fn)(*emb, tok, pos)[0])
    x2 = np.asarray(jax.jit(progs["embed_fwd"].fn)(*emb, tok2, pos)[0])
    np.testing.assert_array_equal(x1[others], x2[others])
    for i, kind in enumerate(R.kinds_of(cfg)):
        layer = cfg.layer_kinds().index(kind.name)
        p = [params["blocks"][layer][n] for n in kind.params(cfg)]
        for role in ("fwd", "fwd_res"):
            f = jax.jit(progs[f"{kind.program_prefix}_{role}"].fn)
            y1, y2 = np.asarray(f(*p, x1, pos)[0]), np.asarray(f(*p, x2, pos)[0])
            np.testing.assert_array_equal(y1[others], y2[others], err_msg=f"{kind.name} {role}")


@pytest.mark.parametrize("stack", ["llama", "mixed", "gpt2"])
def test_a_packed_document_sees_what_it_would_alone(stack: str) -> None:
    """Each document's logits in the packed batch equal those of the same
    document at the start of a sequence of its own (concat, positions
    0..T-1): the mask, RoPE by position and wpe by position together."""
    pack = stack_cfg(stack, packing="pack")
    concat = stack_cfg(stack)
    params = M.init_params(pack, 5)
    pos, spans = layout()
    tok = tokens_for(pack, 1)
    packed = np.asarray(jax.jit(lambda t, p: M.model_logits(pack, params, t, p))(tok, pos))
    alone = jax.jit(lambda t: M.model_logits(concat, params, t))
    for r, row in enumerate(spans):
        for a, b in row:
            solo = np.zeros((concat.microbatch_size, T), np.int32)
            solo[0, :b - a] = tok[r, a:b]
            np.testing.assert_allclose(packed[r, a:b], np.asarray(alone(solo))[0, :b - a], rtol=2e-5, atol=2e-5,
                                       err_msg=f"row {r} document {a}..{b}")


def test_rope_rotates_by_position_in_the_document() -> None:
    """RoPE is relative, so the logits above cannot tell absolute from
    document positions; the rotated q and k (block_fwd_res's residuals) can:
    a document's rows equal those of the same rows at the start of a
    sequence."""
    cfg = stack_cfg("llama", packing="pack")
    params = M.init_params(cfg, 6)
    p = [params["blocks"][0][n] for n in M.BLOCK_PARAMS]
    pos, spans = layout()
    x = np.random.default_rng(3).standard_normal((cfg.microbatch_size, T, cfg.d_model)).astype(np.float32)
    f = jax.jit(PR.programs_by_name(cfg)["block_fwd_res"].fn)
    names = [n for n, _, _ in PR.llama.residuals(cfg)]
    packed = dict(zip(names, f(*p, x, pos)[1:]))
    for r, row in enumerate(spans):
        for a, b in row:
            solo = np.zeros_like(x)
            solo[0, :b - a] = x[r, a:b]
            alone = dict(zip(names, f(*p, solo, np.broadcast_to(np.arange(T, dtype=np.int32), pos.shape))[1:]))
            for n in ("q", "k"):
                np.testing.assert_allclose(np.asarray(packed[n])[r, a:b], np.asarray(alone[n])[0, :b - a],
                                           rtol=1e-5, atol=1e-6, err_msg=f"{n}, row {r} document {a}..{b}")


@pytest.mark.parametrize("stack", ["llama", pytest.param("gpt2", marks=pytest.mark.long)])
def test_pack_bwd_res_equals_bwd(stack: str) -> None:
    """The residual pair's backward (the attention core's segment mask from
    the context) against JAX's differentiation of the forward (bwd)."""
    cfg = stack_cfg(stack, packing="pack", n_kv_heads=2)
    params = M.init_params(cfg, 7)
    kind = R.kinds_of(cfg)[0]
    progs = PR.programs_by_name(cfg)
    pos, _ = layout()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((cfg.microbatch_size, T, cfg.d_model)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    p = [params["blocks"][0][n] for n in kind.params(cfg)]
    pre = kind.program_prefix
    out = jax.jit(progs[f"{pre}_fwd_res"].fn)(*p, x, pos)
    g_res = jax.jit(progs[f"{pre}_bwd_res"].fn)(*p, x, pos, *out[1:], dy)
    g = jax.jit(progs[f"{pre}_bwd"].fn)(*p, x, pos, dy)
    for name, a, b in zip([*kind.params(cfg), "dx"], g_res, g, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(jax.jit(progs[f"{pre}_fwd"].fn)(*p, x, pos)[0]))


# --- the reference: pack with uniform positions is concat; global normalisation ---

# All in make test-long (~15 s): make test keeps the normalisation test
# below and the trainer's equivalence (test_packing_train.py).
@pytest.mark.long
@pytest.mark.parametrize("block,packing", [("llama", "pack"), ("gpt2", "pack"), ("llama", "none")])
def test_reference_pack_with_uniform_positions_is_concat(block: str, packing: str) -> None:
    """Positions 0..T-1 and weights 1 (the concat sampler's batches): the
    packed reference trains as the concat one, up to rounding ((mb*T)/W =
    1/n, sum(ce)/(mb*T) = the mean)."""
    base = tiny_config(steps=5, block=block)
    tokens = D.synthetic_tokens(64, 4096)
    _, ref = RT.train(RT.load_config(json.dumps(base)), tokens)
    # The pack programs on the concat sampler's batches (the model's
    # packing set apart from data.packing's, which would draw documents).
    p, got = RT.train(RT.load_config(json.dumps({**base, "model": {**base["model"], "packing": packing}})), tokens)
    assert ModelConfig.from_dict(RT.load_config(json.dumps({**base, "data": {"packing": packing}}))["model"]).packing \
        == packing
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-5)
    np.testing.assert_allclose(got["grad_norms"], ref["grad_norms"], rtol=1e-4)
    np.testing.assert_allclose([e[1] for e in got["eval_losses"]], [e[1] for e in ref["eval_losses"]], rtol=1e-5)


def _weighted_batch(cfg: ModelConfig, n_micro: int) -> tuple[np.ndarray, ...]:
    """tokens, targets, mask, positions [n_micro, mb, T]: the layout's
    positions, padding and a prompt weighted 0, microbatches of very
    different total weight (so a mean of per-microbatch means would differ)."""
    pos, spans = layout()
    rng = np.random.default_rng(11)
    shape = (n_micro, cfg.microbatch_size, T)
    tokens = rng.integers(0, cfg.vocab_size, shape).astype(np.int32)
    targets = rng.integers(0, cfg.vocab_size, shape).astype(np.int32)
    positions = np.broadcast_to(pos, shape).copy()
    mask = np.ones(shape, np.float32)
    a, b = spans[PADDED_ROW][-1]
    mask[:, PADDED_ROW, a:b] = 0.0  # padding
    mask[:, 0, 5:8] = 0.0  # a prompt inside the second document
    mask[1, :, 3:] = 0.0  # microbatch 1 weighs much less
    return tokens, targets, mask, positions


@pytest.mark.parametrize("packing", ["pack", pytest.param("none", marks=pytest.mark.long)])
def test_reference_normalises_by_the_global_sum_of_weights(packing: str) -> None:
    """loss = sum(ce * w) / sum(w) over the whole batch (every microbatch),
    computed directly in float64 from the model's logits; the gradient norm
    and every group's squared norm, scaled by (mb*T)/W, those of the
    gradient of that loss; and the gradient AdamW gets (its first moment,
    (1 - beta1) g, clipping off) is that gradient."""
    cfg = ModelConfig.from_dict(tiny_model(packing=packing))
    n_micro = 2
    params = M.init_params(cfg, 9)
    tokens, targets, mask, positions = _weighted_batch(cfg, n_micro)
    W = float(mask.sum(dtype=np.float64))
    logits = np.asarray(jax.jit(jax.vmap(lambda t, p: M.model_logits(cfg, params, t, p)))(tokens, positions), np.float64)
    logp = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    ce = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    want = float(np.sum(ce * mask) / W)
    means = [float(np.sum(ce[i] * mask[i]) / mask[i].sum()) for i in range(n_micro)]
    assert abs(np.mean(means) - want) > 1e-3 * want  # the batch tells the two apart

    step = RT.make_train_step(cfg)
    zeros = jax.tree.map(jnp.zeros_like, params)
    tc = RT.TrainConfig.from_dict(tiny_config()["train"])
    out = step(params, zeros, jax.tree.map(jnp.zeros_like, params), *(jnp.asarray(a) for a in
               (tokens, targets, mask, positions)), jnp.float32(1), jnp.float32(1e-3), jnp.asarray(tc.hyper),
               jnp.float32(0.0))
    losses, sqn = np.asarray(out[3]), np.asarray(out[4], np.float64)
    np.testing.assert_allclose(losses, np.sum(ce * mask, axis=(1, 2)) / (cfg.microbatch_size * T), rtol=1e-5)
    assert RT.host_loss(cfg, losses, mask) == pytest.approx(want, rel=1e-5)

    def direct(p: Any) -> Any:
        per = jax.vmap(lambda t, y, k, q: M.model_loss(cfg, p, t, y, k, q))(tokens, targets, mask, positions)
        return jnp.sum(per) * jnp.float32(cfg.microbatch_size * T) / jnp.float32(W)

    g = jax.jit(jax.grad(direct))(params)
    groups = [g["embed"], *g["blocks"], g["head"]]
    g_sq = np.array([sum(float(np.sum(np.asarray(a, np.float64) ** 2)) for a in grp.values()) for grp in groups])
    scale = cfg.microbatch_size * T / W
    np.testing.assert_allclose(sqn * scale ** 2, g_sq, rtol=1e-4)
    assert RT.host_norm(cfg, tc, float(sqn.sum()), mask) == pytest.approx(float(np.sqrt(g_sq.sum())), rel=1e-5)
    m_new = M.flatten_params(out[1])
    for name, want_g in M.flatten_params(g).items():
        gn = np.asarray(want_g)
        np.testing.assert_allclose(np.asarray(m_new[name]), (1 - tc.beta1) * gn, rtol=2e-4,
                                   atol=1e-6 * float(np.max(np.abs(gn))), err_msg=name)


# --- tensor parallelism: the positions cut over the batch like x ----------------

_TP_CHILD = r"""
import json, sys
import numpy as np
import jax
jax.config.update("jax_platforms", "cpu")
from strata_jax import model as M, programs as PR, tensor_parallel as TP
from strata_jax.config import ModelConfig
from strata_jax.mesh import MeshSpec, make_mesh
cfg = ModelConfig.from_dict(json.loads(sys.argv[1]))
pos = np.asarray(json.loads(sys.argv[2]), np.int32)
mesh = MeshSpec(fsdp=2, tensor=2)
jm = make_mesh(mesh)
params = M.init_params(cfg, 4)["blocks"][0]
rng = np.random.default_rng(0)
x = rng.standard_normal((cfg.microbatch_size, cfg.seq_len, cfg.d_model)).astype(np.float32)
dy = rng.standard_normal(x.shape).astype(np.float32)
one = PR.programs_by_name(cfg)
p = [np.asarray(params[n]) for n in M.BLOCK_PARAMS]
want_y = np.asarray(jax.jit(one["block_fwd"].fn)(*p, x, pos)[0])
want_g = [np.asarray(a) for a in jax.jit(one["block_bwd"].fn)(*p, x, pos, dy)]
progs = {q.name: q for q in TP.block_programs(cfg, mesh)}
def run(prog, values):
    blocks = [TP.shard(v, s, mesh) for v, s in zip(values, prog.inputs)]
    outs = prog.run(jm, [[b[d] for b in blocks] for d in range(mesh.devices)])
    return [TP.unshard([outs[d][i] for d in range(mesh.devices)], s, mesh) for i, s in enumerate(prog.outputs)]
y = run(progs["tp_block_fwd"], p + [x, pos])[0]
g = run(progs["tp_block_bwd"], p + [x, pos, dy])
err = max([float(np.max(np.abs(y - want_y)))] + [float(np.max(np.abs(a - b))) for a, b in zip(g, want_g)])
print(json.dumps({"err": err}))
"""


def test_tensor_parallel_pack_programs_match_one_device() -> None:
    cfg = tiny_model(packing="pack", microbatch_size=4)
    pos, _ = layout()
    pos4 = np.concatenate([pos, pos[::-1]])
    env = {**PY_ENV, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    r = subprocess.run([os.path.join(ROOT, ".venv", "bin", "python"), "-c", _TP_CHILD, json.dumps(cfg),
                        json.dumps(pos4.tolist())], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["err"] < 1e-5


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
