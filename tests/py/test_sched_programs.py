"""The residual-keeping block programs of sched.remat (docs/bundle.md,
docs/scheduling.md): block_fwd_res's y against block_fwd, block_bwd_res's
gradients from those residuals against block_bwd (jax.vjp of the whole
block), the residual set's size, and that block_bwd_res needs nothing it is
not given."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_model

from strata_jax import model as M
from strata_jax import programs as P
from strata_jax.model import ModelConfig


def _inputs(cfg: ModelConfig, seed: int) -> tuple[list[jax.Array], jax.Array, jax.Array]:
    key = jax.random.PRNGKey(seed)
    block = M.init_params(cfg, seed)["blocks"][1]
    params = []
    for i, n in enumerate(M.BLOCK_PARAMS):
        p = block[n]
        if p.ndim == 1:  # norm gains away from 1, so their gradients are not special
            p = p + 0.1 * jax.random.normal(jax.random.fold_in(key, i), p.shape)
        params.append(p)
    shape = (cfg.microbatch_size, cfg.seq_len, cfg.d_model)
    x = jax.random.normal(jax.random.fold_in(key, 100), shape)
    dy = jax.random.normal(jax.random.fold_in(key, 101), shape)
    return params, x, dy


def _assert_same_y(dtype: str, got: np.ndarray, want: np.ndarray) -> None:
    """block_fwd_res's y against block_fwd's. Same operations, but a
    different XLA computation (eight more outputs, the residuals), which XLA
    may fuse and order differently. Measured on 30 seeds: bf16 is bitwise
    equal; f32 differs in 20 of 30720 elements, each by one rounding of a
    sum whose terms are up to max|y| (1 ulp of the element, up to 8 ulp of
    an element near 0 after cancellation). So: bitwise for bf16; for f32
    within one ulp of max|y| (at most 1.2e-7 of it), where the former
    rtol=1e-6/atol=1e-6 let a real 1e-6 difference through."""
    assert got.dtype == want.dtype == np.float32
    if dtype == "bf16":
        np.testing.assert_array_equal(got, want)
        return
    ulp = float(np.spacing(np.max(np.abs(want))))
    worst = float(np.max(np.abs(got - want)))
    assert worst <= ulp, f"y differs by {worst:.3e}, more than one ulp of max|y| ({ulp:.3e})"


@pytest.mark.parametrize("dtype,tol", [("f32", 1e-5), pytest.param("bf16", 3e-2, marks=pytest.mark.long)])
def test_residual_programs_match_the_recomputing_ones(dtype: str, tol: float) -> None:
    cfg = ModelConfig.from_dict(tiny_model(compute_dtype=dtype))
    progs = P.programs_by_name(cfg)
    fwd, fwd_res = jax.jit(progs["block_fwd"].fn), jax.jit(progs["block_fwd_res"].fn)
    bwd, bwd_res = jax.jit(progs["block_bwd"].fn), jax.jit(progs["block_bwd_res"].fn)
    for seed in (0, 1):
        params, x, dy = _inputs(cfg, seed)
        (y,) = fwd(*params, x)
        out = fwd_res(*params, x)
        assert [tuple(o.shape) for o in out] == [s.shape for s in progs["block_fwd_res"].outputs]
        _assert_same_y(dtype, np.asarray(out[0]), np.asarray(y))
        want = bwd(*params, x, dy)
        got = bwd_res(*params, x, *out[1:], dy)
        assert len(got) == len(want) == len(M.BLOCK_PARAMS) + 1
        for name, g, w in zip(list(M.BLOCK_PARAMS) + ["dx"], got, want):
            g, w = np.asarray(g), np.asarray(w)
            rel = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30)
            assert rel <= tol, f"{dtype} seed {seed}: {name} differs by {rel:.2e} (relative to its max)"


def test_backward_uses_only_its_inputs() -> None:
    """block_bwd_res must not secretly recompute the forward from x: with the
    residuals it is given swapped for another input's, its gradients follow
    the swapped residuals (a recomputing program would ignore them)."""
    cfg = ModelConfig.from_dict(tiny_model())
    progs = P.programs_by_name(cfg)
    fwd_res, bwd_res = jax.jit(progs["block_fwd_res"].fn), jax.jit(progs["block_bwd_res"].fn)
    params, x, dy = _inputs(cfg, 0)
    _, x2, _ = _inputs(cfg, 1)
    res = fwd_res(*params, x)[1:]
    res2 = fwd_res(*params, x2)[1:]
    g = bwd_res(*params, x, *res, dy)
    g_swapped = bwd_res(*params, x, *res2, dy)
    i_wq = M.BLOCK_PARAMS.index("wq")
    assert not np.allclose(np.asarray(g[i_wq]), np.asarray(g_swapped[i_wq]))


def test_residual_set_size() -> None:
    cfg = ModelConfig.from_dict(tiny_model())
    specs = P.residual_specs(cfg)
    assert [s.name for s in specs] == list(P.RESIDUALS)
    assert all(s.role == "residual" and s.dtype == "f32" for s in specs)
    floats = sum(int(np.prod(s.shape)) for s in specs)
    per_token = 5 * cfg.d_model + 2 * cfg.d_ff + cfg.n_heads
    assert floats == cfg.microbatch_size * cfg.seq_len * per_token
