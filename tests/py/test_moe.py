"""The moe block's maths (python/strata_jax/moe.py, docs/model.md "Block kinds", moe)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_model

from strata_jax import moe as X
from strata_jax.model import ModelConfig


def _cfg(**over) -> ModelConfig:
    return ModelConfig.from_dict(tiny_model(d_model=16, n_heads=2, d_ff=24, seq_len=8, **over))


def _rand_params(cfg: ModelConfig, mc: X.MoeConfig, rng: np.random.Generator, std: float = 0.3,
                 dtype=np.float32) -> dict[str, np.ndarray]:
    out = {}
    for n in X.MOE_PARAMS:
        shape = X.moe_param_shape(cfg, mc, n)
        base = np.ones(shape) if len(shape) == 1 else np.zeros(shape)
        out[n] = (base + std * rng.standard_normal(shape)).astype(dtype)
    out["router"] = (3.0 * out["router"]).astype(dtype)  # well separated routing
    return out


def _silu(a: np.ndarray) -> np.ndarray:
    return a / (1.0 + np.exp(-a))


def _naive_moe(mc: X.MoeConfig, p: dict[str, np.ndarray], h: np.ndarray):
    """One token at a time, in float64, experts visited sparsely."""
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    hn = np.asarray(h, np.float64).reshape(-1, h.shape[-1])
    N, E = hn.shape[0], mc.n_experts
    out = np.zeros_like(hn)
    counts = np.zeros(E)
    prob_sum = np.zeros(E)
    z = 0.0
    for n in range(N):
        logits = hn[n] @ p["router"]
        m = logits.max()
        lse = m + math.log(np.sum(np.exp(logits - m)))
        probs = np.exp(logits - lse)
        order = sorted(range(E), key=lambda e: (-probs[e], e))[:mc.top_k]
        for e in order:
            hid = _silu(hn[n] @ p["w_gate"][e]) * (hn[n] @ p["w_up"][e])
            out[n] += probs[e] * (hid @ p["w_down"][e])
            counts[e] += 1
        prob_sum += probs
        z += lse * lse
    load = counts / (N * mc.top_k)
    aux = E * float(np.sum(load * prob_sum / N))
    return out.reshape(h.shape), aux, z / N, load


@pytest.mark.parametrize("E,k", [(4, 1), (4, 2), (3, 3)])
def test_vectorised_forward_equals_per_token_loop(E: int, k: int) -> None:
    cfg = _cfg()
    mc = X.MoeConfig(n_experts=E, top_k=k, aux_weight=0.01, z_weight=0.001)
    rng = np.random.default_rng(E * 10 + k)
    p = _rand_params(cfg, mc, rng)
    h = rng.standard_normal((2, cfg.seq_len, cfg.d_model)).astype(np.float32)
    out, aux, z, load = jax.jit(lambda p_, h_: X.moe_mlp(cfg, mc, p_, h_))(p, h)
    r_out, r_aux, r_z, r_load = _naive_moe(mc, p, h)
    np.testing.assert_allclose(out, r_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(aux), r_aux, rtol=1e-5)
    np.testing.assert_allclose(float(z), r_z, rtol=1e-5)
    np.testing.assert_allclose(load, r_load, rtol=0, atol=1e-7)
    assert abs(float(np.sum(load)) - 1.0) < 1e-6
    if k < E:  # the routing is not trivial: some token does not use some expert
        assert len(set(np.round(r_load, 6))) > 1 or E > 1


def _losses(probs: list[list[float]], k: int, shift: float = 0.0):
    p = np.asarray(probs, np.float64)
    mc = X.MoeConfig(n_experts=p.shape[1], top_k=k, aux_weight=1.0, z_weight=1.0)
    logits = jnp.asarray(np.log(p) + shift, jnp.float32)
    pr, _, chosen = X.route(mc, logits)
    aux, z, load = X.moe_losses(mc, logits, pr, chosen)
    return float(aux), float(z), np.asarray(load)


def test_aux_and_z_losses_on_hand_made_routings() -> None:
    skew = [0.7, 0.1, 0.1, 0.1]
    # every token on expert 0: f = [1,0,0,0], P = skew, aux = 4 * 0.7
    aux, z, load = _losses([skew] * 4, k=1)
    assert aux == pytest.approx(2.8, rel=1e-6) and z == pytest.approx(0.0, abs=1e-10)
    np.testing.assert_allclose(load, [1, 0, 0, 0])
    # a perfectly balanced top-1 routing with uniform mean probabilities: aux = 1
    rows = [np.roll(skew, i).tolist() for i in range(4)]
    aux, _, load = _losses(rows, k=1)
    assert aux == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(load, [0.25] * 4)
    # top-2: f counts assignments / (N k)
    a = [0.4, 0.3, 0.2, 0.1]
    aux, _, load = _losses([a, a, a[::-1], a[::-1]], k=2)
    np.testing.assert_allclose(load, [0.25] * 4)
    assert aux == pytest.approx(1.0, rel=1e-6)
    aux, _, load = _losses([a] * 4, k=2)
    np.testing.assert_allclose(load, [0.5, 0.5, 0, 0])
    assert aux == pytest.approx(4 * (0.5 * 0.4 + 0.5 * 0.3), rel=1e-6)
    # z-loss: logsumexp of logits log(p) + c is c, so z = c^2
    _, z, _ = _losses([skew] * 4, k=1, shift=3.0)
    assert z == pytest.approx(9.0, rel=1e-5)


def test_moe_mlp_backward_matches_central_differences_in_f64() -> None:
    cfg = _cfg()
    mc = X.MoeConfig(n_experts=4, top_k=2, aux_weight=0.3, z_weight=0.2)
    rng = np.random.default_rng(7)
    with jax.enable_x64(True):
        p = _rand_params(cfg, mc, rng, dtype=np.float64)
        h = rng.standard_normal((2, cfg.seq_len, cfg.d_model))
        w = rng.standard_normal(h.shape)

        def obj(p_, h_):
            out, aux, z, _ = X.moe_mlp(cfg, mc, p_, h_)
            return jnp.sum(out * w) + mc.aux_weight * aux + mc.z_weight * z

        f = jax.jit(obj)
        gp, gh = jax.jit(jax.grad(obj, argnums=(0, 1)))(p, h)
        assert gp["router"].dtype == jnp.float64
        assert float(jnp.max(jnp.abs(gp["router"]))) > 0
        eps = 1e-6
        for trial in range(4):
            dp = {n: rng.standard_normal(v.shape) for n, v in p.items()}
            dh = rng.standard_normal(h.shape)
            if trial == 1:  # the router alone: its gradient comes from gates, aux and z
                dp = {n: (v if n == "router" else 0 * v) for n, v in dp.items()}
                dh = 0 * dh
            if trial == 2:
                dp = {n: 0 * v for n, v in dp.items()}
            plus = float(f({n: p[n] + eps * dp[n] for n in p}, h + eps * dh))
            minus = float(f({n: p[n] - eps * dp[n] for n in p}, h - eps * dh))
            numeric = (plus - minus) / (2 * eps)
            analytic = sum(float(jnp.sum(gp[n] * dp[n])) for n in p) + float(jnp.sum(gh * dh))
            assert abs(analytic - numeric) <= 1e-6 * max(1.0, abs(analytic)), (trial, analytic, numeric)


def test_aux_losses_alone_have_the_expected_router_gradient() -> None:
    """With the output cotangent zero only aux and z move the router: check
    jax's gradient of the weighted losses against central differences too."""
    cfg = _cfg()
    mc = X.MoeConfig(n_experts=4, top_k=1, aux_weight=1.0, z_weight=0.5)
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        p = _rand_params(cfg, mc, rng, dtype=np.float64)
        h = rng.standard_normal((16, cfg.d_model))

        def obj(r):
            _, aux, z, _ = X.moe_mlp(cfg, mc, {**p, "router": r}, h)
            return mc.aux_weight * aux + mc.z_weight * z

        g = jax.grad(obj)(p["router"])
        d = rng.standard_normal(g.shape)
        eps = 1e-6
        numeric = (float(obj(p["router"] + eps * d)) - float(obj(p["router"] - eps * d))) / (2 * eps)
        assert float(jnp.sum(g * d)) == pytest.approx(numeric, rel=1e-6, abs=1e-9)
        assert float(jnp.max(jnp.abs(g))) > 1e-6


def test_block_bwd_matches_finite_differences_f32() -> None:
    """The whole block (attention too) in f32, the way test_model checks llama's:
    moe_block_bwd seeds aux and z with their weights."""
    cfg = _cfg()
    mc = X.MoeConfig(n_experts=4, top_k=2, aux_weight=0.5, z_weight=0.1)
    rng = np.random.default_rng(11)
    p = _rand_params(cfg, mc, rng)
    x = rng.standard_normal((2, cfg.seq_len, cfg.d_model)).astype(np.float32)
    w = rng.standard_normal(x.shape)
    fwd = jax.jit(lambda p_, x_: X.moe_block_fwd(cfg, mc, p_, x_))
    bwd = jax.jit(lambda p_, x_, g_: X.moe_block_bwd(cfg, mc, p_, x_, g_))

    def obj(p_, x_) -> float:
        y, aux, z, _ = fwd({n: v.astype(np.float32) for n, v in p_.items()}, x_.astype(np.float32))
        return float(np.sum(np.asarray(y, np.float64) * w)) + mc.aux_weight * float(aux) + mc.z_weight * float(z)

    dp, dx = bwd(p, x, w.astype(np.float32))
    p64 = {n: v.astype(np.float64) for n, v in p.items()}
    x64 = x.astype(np.float64)
    eps = 1e-3
    for trial in range(2):
        dirs = {n: rng.standard_normal(v.shape) for n, v in p.items()}
        dxd = rng.standard_normal(x.shape) * (trial == 0)
        plus = obj({n: p64[n] + eps * dirs[n] for n in p}, x64 + eps * dxd)
        minus = obj({n: p64[n] - eps * dirs[n] for n in p}, x64 - eps * dxd)
        numeric = (plus - minus) / (2 * eps)
        analytic = sum(float(np.sum(np.asarray(dp[n], np.float64) * dirs[n])) for n in p) \
            + float(np.sum(np.asarray(dx, np.float64) * dxd))
        assert abs(analytic - numeric) <= 1e-3 * max(1.0, abs(analytic)), (trial, analytic, numeric)


def test_k1_router_learns_from_the_main_loss() -> None:
    """Gates are not renormalised, so with top_k = 1 the router's gradient is
    nonzero even with both auxiliary weights 0."""
    cfg = _cfg()
    mc = X.MoeConfig(n_experts=4, top_k=1, aux_weight=0.0, z_weight=0.0)
    rng = np.random.default_rng(5)
    p = _rand_params(cfg, mc, rng)
    x = rng.standard_normal((2, cfg.seq_len, cfg.d_model)).astype(np.float32)
    dp, _ = X.moe_block_bwd(cfg, mc, p, x, jnp.ones_like(x))
    assert float(jnp.max(jnp.abs(dp["router"]))) > 1e-4


def test_init_is_seeded_one_draw_and_scaled() -> None:
    cfg = _cfg(n_layers=3, init_std=0.02)
    mc = X.MoeConfig(n_experts=8, top_k=2, aux_weight=0.01, z_weight=0.001)
    init = jax.jit(lambda s, l, n: X.init_moe_block(cfg, mc, s, l, n))
    a = init(jnp.int32(3), jnp.int32(1), jnp.int32(3))
    b = init(jnp.int32(3), jnp.int32(1), jnp.int32(3))
    c = init(jnp.int32(3), jnp.int32(2), jnp.int32(3))
    assert set(a) == set(X.MOE_PARAMS)
    for n in X.MOE_PARAMS:
        assert a[n].shape == X.moe_param_shape(cfg, mc, n)
        np.testing.assert_array_equal(a[n], b[n])
    assert a["w_gate"].shape == (8, 16, 24) and a["router"].shape == (16, 8)
    assert not np.allclose(a["wq"], c["wq"])
    np.testing.assert_array_equal(a["mlp_norm"], np.ones(16, np.float32))
    assert abs(float(np.std(a["w_up"])) - 0.02) < 0.002
    assert abs(float(np.std(a["w_down"])) - 0.02 / math.sqrt(6)) < 0.001


def test_bad_top_k_names_the_key() -> None:
    with pytest.raises(ValueError, match="model.moe_top_k"):
        X.MoeConfig(n_experts=4, top_k=5, aux_weight=0.0, z_weight=0.0)
    with pytest.raises(ValueError, match="model.moe_top_k"):
        X.MoeConfig(n_experts=4, top_k=0, aux_weight=0.0, z_weight=0.0)
    with pytest.raises(ValueError, match="model.n_experts"):
        X.MoeConfig(n_experts=0, top_k=1, aux_weight=0.0, z_weight=0.0)


def test_exported_programs_backward_matches_finite_differences() -> None:
    """moe_bwd and moe_bwd_res (the programs C runs) against central
    differences of moe_fwd's <y, dy> + aux_weight·aux + z_weight·z, and the
    programs' tables: y then the three metrics, no residuals."""
    from strata_jax import blocks
    from strata_jax import programs as PR

    cfg = ModelConfig.from_dict(tiny_model(d_model=16, n_heads=2, d_ff=24, seq_len=8, block="moe", n_experts=4,
                                           moe_top_k=2, moe_aux_weight=0.5, moe_z_weight=0.1))
    kind = blocks.KINDS["moe"]
    progs = PR.kind_programs(cfg, kind)
    assert [(o.name, o.role, o.shape) for o in progs["fwd"].outputs[1:]] == \
        [("aux_loss", "metric", ()), ("z_loss", "metric", ()), ("expert_load", "metric", (4,))]
    assert [o.name for o in progs["fwd_res"].outputs] == [o.name for o in progs["fwd"].outputs]
    assert len(progs["bwd_res"].inputs) == len(kind.params(cfg)) + 2
    names = kind.params(cfg)
    rng = np.random.default_rng(0)
    p = {n: rng.normal(0, 0.3 if len(kind.param_shape(cfg, n)) > 1 else 1.0,
                       kind.param_shape(cfg, n)).astype(np.float32) for n in names}
    p["router"] *= 10  # well separated choices: a step of h moves no token to another expert
    x = rng.normal(0, 1, (cfg.microbatch_size, cfg.seq_len, cfg.d_model)).astype(np.float32)
    dy = rng.normal(0, 1, x.shape).astype(np.float32)
    u = {n: rng.normal(0, 1, a.shape).astype(np.float32) for n, a in p.items()}
    w = rng.normal(0, 1, x.shape).astype(np.float32)
    fwd = jax.jit(progs["fwd"].fn)
    got_res = jax.jit(progs["bwd_res"].fn)(*[p[n] for n in names], x, dy)
    got_bwd = jax.jit(progs["bwd"].fn)(*[p[n] for n in names], x, dy)

    def f(t: float) -> float:
        y, aux, z, _ = fwd(*[p[n] + t * u[n] for n in names], x + t * w)
        return float(np.sum(np.asarray(y, np.float64) * dy)) + 0.5 * float(aux) + 0.1 * float(z)

    h = 1e-3
    fd = (f(h) - f(-h)) / (2 * h)
    for got in (got_res, got_bwd):
        an = sum(float(np.vdot(g, u[n])) for n, g in zip(names, got[:-1])) + float(np.vdot(got[-1], w))
        assert abs(an - fd) <= 3e-3 * abs(fd), (an, fd)
    # the aux losses' share alone (dy = 0): what the seeds (the weights) give
    zero = np.zeros_like(dy)
    got0 = jax.jit(progs["bwd"].fn)(*[p[n] for n in names], x, zero)
    g = lambda t: 0.5 * float(fwd(*[p[n] + t * u[n] for n in names], x)[1]) + \
        0.1 * float(fwd(*[p[n] + t * u[n] for n in names], x)[2])  # noqa: E731
    fd0 = (g(h) - g(-h)) / (2 * h)
    an0 = sum(float(np.vdot(gr, u[n])) for n, gr in zip(names, got0[:-1]))
    assert abs(an0 - fd0) <= 1e-2 * abs(fd0) + 1e-5, (an0, fd0)
    assert abs(fd0) > 1e-4
