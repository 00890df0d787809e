"""The model functions and the program functions built on them."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_model

from strata_jax import model as M
from strata_jax.model import ModelConfig
from strata_jax.programs import build_programs, programs_by_name


def _rand_block(cfg: ModelConfig, rng: np.random.Generator, std: float = 0.3) -> list[np.ndarray]:
    out = []
    for n in M.BLOCK_PARAMS:
        shape = M.param_shape(cfg, n)
        base = np.ones(shape) if len(shape) == 1 else np.zeros(shape)
        out.append((base + std * rng.standard_normal(shape)).astype(np.float32))
    return out


def test_init_is_seeded_and_scaled() -> None:
    cfg = ModelConfig.from_dict(tiny_model(d_model=64, d_ff=128, vocab_size=256, n_layers=3))
    a, b = M.init_params(cfg, 3), M.init_params(cfg, 3)
    c = M.init_params(cfg, 4)
    np.testing.assert_array_equal(a["blocks"][1]["wq"], b["blocks"][1]["wq"])
    assert not np.allclose(a["blocks"][1]["wq"], c["blocks"][1]["wq"])
    assert not np.allclose(a["blocks"][0]["wq"], a["blocks"][1]["wq"])
    assert not np.allclose(a["blocks"][0]["wq"], a["blocks"][0]["wk"])
    np.testing.assert_array_equal(a["blocks"][0]["attn_norm"], np.ones(64, np.float32))
    np.testing.assert_array_equal(a["head"]["final_norm"], np.ones(64, np.float32))
    assert "w_out" not in a["head"]
    assert abs(float(np.std(a["embed"]["wte"])) - 0.02) < 0.002
    assert abs(float(np.std(a["blocks"][2]["w_down"])) - 0.02 / math.sqrt(6)) < 0.001
    assert abs(float(np.std(a["blocks"][2]["w_up"])) - 0.02) < 0.002
    # the init programs give the same values as init_params
    progs = programs_by_name(cfg)
    seed, layer = jnp.int32(3), jnp.int32(2)
    blk = jax.jit(progs["block_init"].fn)(seed, layer, jnp.int32(3))
    for n, arr in zip(M.BLOCK_PARAMS, blk):
        np.testing.assert_array_equal(arr, a["blocks"][2][n])


def test_attention_is_causal_and_rope_preserves_norm() -> None:
    cfg = ModelConfig.from_dict(tiny_model())
    rng = np.random.default_rng(0)
    p = dict(zip(M.BLOCK_PARAMS, _rand_block(cfg, rng)))
    x = rng.standard_normal((2, cfg.seq_len, cfg.d_model)).astype(np.float32)
    x2 = x.copy()
    x2[:, 9:] += 1.0
    fwd = jax.jit(lambda x_: M.block_fwd(cfg, p, x_))
    y, y2 = fwd(x), fwd(x2)
    np.testing.assert_allclose(y[:, :9], y2[:, :9], rtol=1e-6, atol=1e-6)
    assert not np.allclose(y[:, 9:], y2[:, 9:])
    cos, sin = M.rope_tables(cfg)
    q = rng.standard_normal((1, cfg.seq_len, cfg.n_heads, cfg.head_dim)).astype(np.float32)
    r = M.apply_rope(jnp.asarray(q), cos, sin)
    np.testing.assert_allclose(np.linalg.norm(r, axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(r[:, 0], q[:, 0], rtol=1e-6)  # position 0 is not rotated


def _fd_directional(f, args: list[np.ndarray], dirs: list[np.ndarray], eps: float) -> float:
    plus = f(*[a + eps * d for a, d in zip(args, dirs)])
    minus = f(*[a - eps * d for a, d in zip(args, dirs)])
    return (plus - minus) / (2 * eps)


def test_block_bwd_matches_finite_differences() -> None:
    cfg = ModelConfig.from_dict(tiny_model(d_model=16, n_heads=2, d_ff=32, seq_len=8))
    progs = programs_by_name(cfg)
    fwd, bwd = jax.jit(progs["block_fwd"].fn), jax.jit(progs["block_bwd"].fn)
    rng = np.random.default_rng(1)
    params = _rand_block(cfg, rng)
    x = rng.standard_normal((2, cfg.seq_len, cfg.d_model)).astype(np.float32)
    w = rng.standard_normal(x.shape)  # cotangent: L = sum(y * w), evaluated in f64

    def loss(*args: np.ndarray) -> float:
        y = np.asarray(fwd(*[a.astype(np.float32) for a in args])[0], np.float64)
        return float(np.sum(y * w))

    grads = bwd(*params, x, w.astype(np.float32))
    assert len(grads) == len(params) + 1
    args = [a.astype(np.float64) for a in params + [x]]
    for trial in range(3):  # directions in all inputs at once, then params only / x only
        dirs = [rng.standard_normal(a.shape) for a in args]
        if trial == 1:
            dirs[-1] *= 0
        if trial == 2:
            dirs[:-1] = [d * 0 for d in dirs[:-1]]
        analytic = sum(float(np.sum(np.asarray(g, np.float64) * d)) for g, d in zip(grads, dirs))
        numeric = _fd_directional(loss, args, dirs, eps=1e-3)
        assert abs(analytic - numeric) <= 1e-3 * max(1.0, abs(analytic)), (trial, analytic, numeric)


# tied f32 is also covered, through the MLIR texts, by test_reference's layer-by-layer run
@pytest.mark.parametrize("tied,dtype", [(False, "f32"), (True, "bf16")])
def test_chained_programs_match_full_model_grad(tied: bool, dtype: str) -> None:
    """embed_fwd -> block_fwd* -> head_loss -> block_bwd* -> embed_bwd == jax.grad(model)."""
    cfg = ModelConfig.from_dict(tiny_model(tie_embeddings=tied, compute_dtype=dtype, init_std=0.2))
    progs = {p.name: jax.jit(p.fn) for p in build_programs(cfg)}
    params = M.init_params(cfg, 5)
    rng = np.random.default_rng(2)
    shape = (cfg.microbatch_size, cfg.seq_len)
    tokens = rng.integers(0, cfg.vocab_size, shape).astype(np.int32)
    targets = rng.integers(0, cfg.vocab_size, shape).astype(np.int32)
    mask = (rng.random(shape) < 0.8).astype(np.float32)

    ref_loss, ref = jax.jit(jax.value_and_grad(lambda p: M.model_loss(cfg, p, tokens, targets, mask)))(params)

    wte = params["embed"]["wte"]
    head_names = M.head_param_names(cfg)
    xs = [progs["embed_fwd"](wte, tokens)[0]]
    for bp in params["blocks"]:
        xs.append(progs["block_fwd"](*[bp[n] for n in M.BLOCK_PARAMS], xs[-1])[0])
    assert all(x.dtype == jnp.float32 for x in xs)
    head_args = [params["head"][n] for n in head_names] + ([wte] if tied else [])
    out = progs["head_loss"](*head_args, xs[-1], targets, mask)
    loss, head_grads = out[0], out[1:1 + len(head_names)]
    dwte_head = out[1 + len(head_names)] if tied else None
    dx = out[-1]
    ev = progs["head_eval"](*head_args, xs[-1], targets, mask)[0]
    np.testing.assert_allclose(ev, loss, rtol=1e-6)
    block_grads = []
    for i in reversed(range(cfg.n_layers)):
        bp = params["blocks"][i]
        *g, dx = progs["block_bwd"](*[bp[n] for n in M.BLOCK_PARAMS], xs[i], dx)
        block_grads.insert(0, dict(zip(M.BLOCK_PARAMS, g)))
    dwte = progs["embed_bwd"](wte, tokens, dx)[0]
    if tied:
        dwte = progs["accum_embed"](dwte, dwte_head)[0]

    tol = dict(rtol=1e-4, atol=1e-6) if dtype == "f32" else dict(rtol=2e-2, atol=1e-4)
    np.testing.assert_allclose(loss, ref_loss, **tol)
    np.testing.assert_allclose(dwte, ref["embed"]["wte"], **tol)
    for n, g in zip(head_names, head_grads):
        np.testing.assert_allclose(g, ref["head"][n], **tol)
    for i in range(cfg.n_layers):
        for n in M.BLOCK_PARAMS:
            np.testing.assert_allclose(block_grads[i][n], ref["blocks"][i][n], **tol, err_msg=f"{i}.{n}")


def test_bf16_close_to_f32() -> None:
    c32 = ModelConfig.from_dict(tiny_model(init_std=0.2))
    c16 = ModelConfig.from_dict(tiny_model(init_std=0.2, compute_dtype="bf16"))
    params = M.init_params(c32, 0)
    rng = np.random.default_rng(3)
    tok = rng.integers(0, 64, (2, 16)).astype(np.int32)
    ones = np.ones((2, 16), np.float32)
    l32 = float(jax.jit(lambda p: M.model_loss(c32, p, tok, tok, ones))(params))
    l16 = float(jax.jit(lambda p: M.model_loss(c16, p, tok, tok, ones))(params))
    assert l32 != l16 and abs(l32 - l16) < 2e-2 * l32


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        ModelConfig.from_dict(tiny_model(n_heads=5))
    with pytest.raises(ValueError):
        ModelConfig.from_dict(tiny_model(compute_dtype="f16"))
    with pytest.raises(ValueError):
        ModelConfig.from_dict({"vocab_size": 3})
