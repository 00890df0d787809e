"""kernels.py (docs/kernels.md): the selection rules, the pallas kernels
against the jnp reference in JAX (forward and gradients, odd shapes), the
fallback outside the contract, and what the exporter writes (the manifest's
kernels, the custom calls). The ffi kernels cannot run in JAX (only strata
registers their handlers): tests/c/test_kernels.c and
tests/e2e/test_kernels.sh run them."""

from __future__ import annotations

import json

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import tolerance as TOL
from conftest import tiny_model
from strata_jax import export as E
from strata_jax import kernels as K
from strata_jax.model import ModelConfig


def test_selection_is_checked_and_kept_out_of_the_json_at_xla() -> None:
    with pytest.raises(ValueError, match="kernels.conv2d: no such kernel op"):
        ModelConfig.from_dict(tiny_model(kernels={"conv2d": "ffi"}))
    with pytest.raises(ValueError, match=r"kernels.rmsnorm='cuda': not an implementation"):
        ModelConfig.from_dict(tiny_model(kernels={"rmsnorm": "cuda"}))
    plain = ModelConfig.from_dict(tiny_model(kernels={"rmsnorm": "xla"}))
    assert "kernels" not in plain.to_dict() and plain.kernel("rmsnorm") == "xla"
    cfg = ModelConfig.from_dict(tiny_model(kernels={"swiglu": "ffi", "rmsnorm": "pallas"}))
    assert cfg.to_dict()["kernels"] == {"rmsnorm": "pallas", "swiglu": "ffi"}
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_auto_is_resolved_before_export_by_the_contract_default() -> None:
    """kernels.<op>=auto: the contract row's per-platform default, read here
    as strata's C side reads it (tests/c/test_kernels.c checks the same
    answers there). "cuda" stands in for a GPU platform: no GPU here."""
    for op in ("rmsnorm", "swiglu", "cross_entropy", "attention"):
        assert K.default_impl(op, "cpu") == "ffi"
        assert K.default_impl(op, "cuda") == "xla" and K.default_impl(op, "tpu") == "xla"
        assert K.OPS[op]["default"] == {"cpu": "ffi", "other": "xla"}
    with pytest.raises(ValueError, match=r"kernels.swiglu='auto' reached the exporter"):
        ModelConfig.from_dict(tiny_model(kernels={"swiglu": "auto"}))


def _tol(op: str, d: str) -> dict[str, float]:
    return K.OPS[op]["tolerance"]["f32"][d]


@pytest.mark.parametrize("shape", [(1, 1), (3, 8), (2, 33, 257)])
def test_pallas_rmsnorm_matches_reference(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(shape) + shape[-1])
    x = jnp.asarray(rng.uniform(-2, 2, shape), jnp.float32)
    g = jnp.asarray(rng.uniform(0.5, 1.5, shape[-1:]), jnp.float32)
    dy = jnp.asarray(rng.uniform(-2, 2, shape), jnp.float32)
    t = _tol("rmsnorm", "fwd")
    np.testing.assert_allclose(K.rmsnorm_pallas(x, g), K.rmsnorm_xla(x, g), rtol=t["rtol"], atol=t["atol"])
    want = jax.vjp(K.rmsnorm_xla, x, g)[1](dy)
    got = jax.vjp(K.rmsnorm_pallas, x, g)[1](dy)
    t = _tol("rmsnorm", "bwd")
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=t["rtol"], atol=t["atol"])


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5, 1001)])
def test_pallas_swiglu_matches_reference(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(shape[-1])
    a, b, dh = (jnp.asarray(rng.uniform(-4, 4, shape), jnp.float32) for _ in range(3))
    t = _tol("swiglu", "fwd")
    np.testing.assert_allclose(K.swiglu_pallas(a, b), K.swiglu_xla(a, b), rtol=t["rtol"], atol=t["atol"])
    want = jax.vjp(K.swiglu_xla, a, b)[1](dh)
    got = jax.vjp(K.swiglu_pallas, a, b)[1](dh)
    t = _tol("swiglu", "bwd")
    for x, y in zip(got, want):
        np.testing.assert_allclose(x, y, rtol=t["rtol"], atol=t["atol"])


def test_outside_the_contract_falls_back_and_says_so() -> None:
    K.fallbacks_seen.clear()
    x = jnp.ones((2, 4), jnp.bfloat16)
    y = K.call("swiglu", "ffi", x, x)  # bf16: the contract is f32 only
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(jax.nn.silu(x) * x, np.float32))
    entry = K.manifest_entry({"swiglu": "ffi"})
    sw = [o for o in entry["ops"] if o["name"] == "swiglu"][0]
    assert sw["fallback"] == "xla" and "bfloat16" in sw["fallback_reasons"][0], sw
    K.fallbacks_seen.clear()


def test_exporter_writes_kernels_and_custom_calls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = ModelConfig.from_dict(tiny_model(n_layers=1, kernels={"rmsnorm": "ffi", "swiglu": "pallas"}))
    m = E.build_bundle(cfg, str(tmp_path), "k")
    ops = {o["name"]: o for o in m["kernels"]["ops"]}
    assert m["kernels"]["contract_version"] == K.CONTRACT["contract_version"]
    assert ops["rmsnorm"]["impl"] == "ffi" and ops["rmsnorm"]["targets"] == ["strata_rmsnorm_fwd_v1",
                                                                             "strata_rmsnorm_bwd_v1"]
    assert ops["swiglu"]["impl"] == "pallas" and "targets" not in ops["swiglu"]
    assert "fallback" not in ops["rmsnorm"]
    assert ops["rmsnorm"]["contract"]["tolerance"] == K.OPS["rmsnorm"]["tolerance"]  # the row travels along
    text = (tmp_path / "programs" / "block_bwd_res.mlir").read_text()
    # (the forward's custom calls appear too: jax.vjp's primal, dead code XLA removes)
    assert "custom_call @strata_rmsnorm_bwd_v1" in text
    assert "strata_swiglu" not in text  # pallas in interpret mode: plain StableHLO
    fwd = (tmp_path / "programs" / "block_fwd.mlir").read_text()
    assert fwd.count("custom_call @strata_rmsnorm_fwd_v1") == 2
    head = (tmp_path / "programs" / "head_loss.mlir").read_text()
    assert "custom_call @strata_rmsnorm_fwd_v1" in head and "custom_call @strata_rmsnorm_bwd_v1" in head
    assert json.loads((tmp_path / "manifest.json").read_text())["kernels"] == m["kernels"]


@pytest.mark.parametrize("n,v,pad", [(1, 1, 0), (5, 256, 0), (13, 300, 44), (3, 4099, 0)])
def test_pallas_cross_entropy_matches_reference(n: int, v: int, pad: int) -> None:
    """Rows off the row block, V off the chunk, padding ids at -1e30."""
    rng = np.random.default_rng(n * v)
    x = rng.uniform(-3, 3, (n, v)).astype(np.float32)
    x[:, v - pad:] = -1e30
    x = jnp.asarray(x)
    tg = jnp.asarray(rng.integers(0, v - pad, (n,)), jnp.int32)
    dce = jnp.asarray(rng.uniform(-2, 2, (n,)), jnp.float32)
    t = _tol("cross_entropy", "fwd")
    np.testing.assert_allclose(K.cross_entropy_pallas(x, tg), K.cross_entropy_xla(x, tg), rtol=t["rtol"], atol=t["atol"])
    want = jax.vjp(lambda a: K.cross_entropy_xla(a, tg), x)[1](dce)[0]
    got = jax.vjp(lambda a: K.cross_entropy_pallas(a, tg), x)[1](dce)[0]
    t = _tol("cross_entropy", "bwd")
    np.testing.assert_allclose(got, want, rtol=t["rtol"], atol=t["atol"])
    assert not np.any(np.asarray(got)[:, v - pad:])  # padding ids: exactly no gradient


def test_cross_entropy_head_loss_through_the_kernel_matches_jnp() -> None:
    """model.head_loss's glue around the kernel (the [B*T, V] rows, the
    padding ids' mask, the masked mean) against the jnp path, value and
    gradients, on a padded vocabulary."""
    from strata_jax import model as M
    base = tiny_model(vocab_padded=320)
    ref, ker = ModelConfig.from_dict(base), ModelConfig.from_dict({**base, "kernels": {"cross_entropy": "pallas"}})
    p = M.init_params(ref, 3)["head"]
    rng = np.random.default_rng(0)
    B, T = 2, ref.seq_len
    x = jnp.asarray(rng.normal(size=(B, T, ref.d_model)), jnp.float32)
    tg = jnp.asarray(rng.integers(0, ref.vocab_size, (B, T)), jnp.int32)
    mask = jnp.asarray(rng.integers(0, 2, (B, T)), jnp.float32).at[0, 0].set(1.0)
    wte = jnp.asarray(rng.normal(size=(ref.vocab_rows, ref.d_model)) * 0.02, jnp.float32) if ref.tie_embeddings else None

    def f(cfg):  # type: ignore[no-untyped-def]
        return jax.value_and_grad(lambda p_, x_: M.head_loss(cfg, p_, wte, x_, tg, mask), argnums=(0, 1))(p, x)

    (la, (ga, gxa)), (lb, (gb, gxb)) = f(ref), f(ker)
    # The head's sums: the vocabulary (softmax), d_model, the batch's tokens.
    n = ref.vocab_rows + ref.d_model + B * T
    TOL.assert_rounding_close(lb, la, n=n, scale=abs(float(la)), what="head loss")
    TOL.assert_all_rounding_close((gb, gxb), (ga, gxa), n=n, what="head loss gradients")


def test_cross_entropy_targets_fit_the_contract_and_bf16_logits_fall_back() -> None:
    K.fallbacks_seen.clear()
    x = jnp.zeros((2, 5), jnp.float32)
    tg = jnp.array([0, 4], jnp.int32)
    lowered = jax.jit(lambda a, b: K.call("cross_entropy", "ffi", a, b)).lower(x, tg).as_text()
    assert "custom_call @strata_cross_entropy_fwd_v1" in lowered and not K.fallbacks_seen
    y = K.call("cross_entropy", "ffi", x.astype(jnp.bfloat16), tg)
    np.testing.assert_allclose(y, np.log(5.0) * np.ones(2), rtol=1e-6)
    ce = [o for o in K.manifest_entry({"cross_entropy": "ffi"})["ops"] if o["name"] == "cross_entropy"][0]
    assert ce["fallback"] == "xla" and "logits is bfloat16" in ce["fallback_reasons"][0], ce
    K.fallbacks_seen.clear()


# --- attention ----------------------------------------------------------------


def _qkv(B: int, T: int, H: int, KV: int, Dh: int, seed: int) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(seed)
    q, do = (jnp.asarray(rng.uniform(-2, 2, (B, T, H, Dh)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.uniform(-2, 2, (B, T, KV, Dh)), jnp.float32) for _ in range(2))
    return q, k, v, do


def test_attention_reference_backward_is_the_gradient() -> None:
    """attention_bwd_xla (p from lse, delta = rowsum(do * o)) against JAX's
    autodiff of the forward: the formula every other implementation is held to."""
    q, k, v, do = _qkv(2, 19, 4, 2, 8, 3)
    o, lse = K.attention_fwd_xla(q, k, v)
    want = jax.vjp(K.attention_xla, q, k, v)[1](do)
    got = K.attention_bwd_xla(q, k, v, o, lse, do)
    # Same gradient, two orders of its sums: over keys (T) and head_dim.
    TOL.assert_all_rounding_close(got, want, n=19 + 8, what="attention bwd formula vs autodiff")
    # lse is the log-sum-exp of the causal, scaled scores
    s = jnp.einsum("bqhd,bkhd->bhqk", q, jnp.repeat(k, 2, axis=2)) / np.sqrt(8)
    s = jnp.where(jnp.tril(jnp.ones((19, 19), bool)), s, -jnp.inf)
    np.testing.assert_allclose(lse, jax.nn.logsumexp(s, axis=-1), rtol=1e-5, atol=1e-5)


# (1, 70, 2, 1, 16) is a long drill (make test-long): (2, 33, 4, 2, 8) keeps
# grouped heads and a length off the 32-tile, over two tiles, in make test.
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 8), (2, 33, 4, 2, 8),
                                   pytest.param((1, 70, 2, 1, 16), marks=pytest.mark.long)])
def test_pallas_attention_matches_reference(shape: tuple[int, ...]) -> None:
    """Sequence lengths off the 32-tile (padded inside), GQA, one token."""
    q, k, v, do = _qkv(*shape, seed=sum(shape))
    t = _tol("attention", "fwd")
    for a, b in zip(jax.jit(K.attention_fwd_pallas)(q, k, v), K.attention_fwd_xla(q, k, v)):
        np.testing.assert_allclose(a, b, rtol=t["rtol"], atol=t["atol"])
    t = _tol("attention", "bwd")
    grads = jax.jit(lambda f, *a: jax.vjp(f, *a[:3])[1](a[3]), static_argnums=0)  # noqa: E731
    want = grads(K.attention_xla, q, k, v, do)
    got = grads(K.attention_pallas, q, k, v, do)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=t["rtol"], atol=t["atol"])


def test_attention_residual_path_through_pallas_matches_xla() -> None:
    """block_fwd_res / block_bwd_res with kernels.attention=pallas (the kernel's
    two halves in place of the einsums) against the xla programs, with GQA."""
    from strata_jax import programs as PR
    from strata_jax.model import init_block

    ref = ModelConfig.from_dict(tiny_model(n_kv_heads=2, seq_len=20))
    got = ModelConfig.from_dict(tiny_model(n_kv_heads=2, seq_len=20, kernels={"attention": "pallas"}))
    p = init_block(ref, jnp.uint32(5), jnp.int32(0), jnp.int32(2))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 20, 32)), jnp.float32)
    dy = jnp.asarray(rng.normal(size=(2, 20, 32)), jnp.float32)
    fwd = jax.jit(PR.block_fwd_res, static_argnums=0)
    bwd = jax.jit(PR.block_bwd_res, static_argnums=0)
    y0, r0 = fwd(ref, p, x)
    y1, r1 = fwd(got, p, x)
    # The block's sums: tokens (B*T, weight gradients), d_model, d_ff and
    # the keys (attention) along the longest chain (tests/tolerance.py).
    n = 2 * 20 + ref.d_model + ref.d_ff + 20
    TOL.assert_all_rounding_close((y1, r1), (y0, r0), n=n, what="block_fwd_res pallas vs xla")
    g0, dx0 = bwd(ref, p, x, r0, dy)
    g1, dx1 = bwd(got, p, x, r1, dy)
    TOL.assert_all_rounding_close((g1, dx1), (g0, dx0), n=n, what="block_bwd_res pallas vs xla")


def test_attention_outside_the_contract_falls_back() -> None:
    K.fallbacks_seen.clear()
    q = jnp.ones((1, 3, 2, 4), jnp.bfloat16)
    o, lse = K.attention_res("ffi", q, q, q)  # bf16: the contract is f32 only
    assert o.shape == (1, 3, 2, 4) and lse.shape == (1, 2, 3)
    at = [o for o in K.manifest_entry({"attention": "ffi"})["ops"] if o["name"] == "attention"][0]
    assert at["fallback"] == "xla" and "bfloat16" in at["fallback_reasons"][0], at
    K.fallbacks_seen.clear()


def test_exporter_writes_attention_custom_calls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = ModelConfig.from_dict(tiny_model(n_layers=1, n_kv_heads=2, kernels={"attention": "ffi"}))
    m = E.build_bundle(cfg, str(tmp_path), "k")
    at = {o["name"]: o for o in m["kernels"]["ops"]}["attention"]
    assert at["impl"] == "ffi" and at["targets"] == ["strata_attention_fwd_v1", "strata_attention_bwd_v1",
                                                     "strata_attention_seg_fwd_v1", "strata_attention_seg_bwd_v1"]
    progs = tmp_path / "programs"
    fwd_res, bwd_res = (progs / "block_fwd_res.mlir").read_text(), (progs / "block_bwd_res.mlir").read_text()
    assert "custom_call @strata_attention_fwd_v1" in fwd_res and "strata_attention_bwd_v1" not in fwd_res
    assert "custom_call @strata_attention_bwd_v1" in bwd_res
    # the plain path: the forward target in block_fwd, both (via custom_vjp) in block_bwd
    assert "custom_call @strata_attention_fwd_v1" in (progs / "block_fwd.mlir").read_text()
    assert "custom_call @strata_attention_bwd_v1" in (progs / "block_bwd.mlir").read_text()
    # the other ops stay at xla; without segment ids no seg target is called
    assert "strata_rmsnorm" not in fwd_res and "strata_attention_seg" not in fwd_res + bwd_res


def test_attention_residual_forward_is_differentiable() -> None:
    """kernels.attention_res (o, lse) differentiates through the kernel's
    backward for o's cotangent (the tensor-parallel plain block differentiates
    its residual forward), and through the reference when lse has one."""
    q, k, v, do = _qkv(1, 20, 4, 2, 8, 9)
    dl = jnp.asarray(np.random.default_rng(1).uniform(-2, 2, (1, 4, 20)), jnp.float32)

    def grads(impl: str, with_lse: bool):  # type: ignore[no-untyped-def]
        f = lambda *a: K.attention_res(impl, *a)  # noqa: E731
        if with_lse:
            return jax.jit(lambda *a: jax.vjp(f, *a[:3])[1]((a[3], dl)))(q, k, v, do)
        return jax.jit(lambda *a: jax.vjp(lambda *b: f(*b)[0], *a[:3])[1](a[3]))(q, k, v, do)

    t = _tol("attention", "bwd")
    for with_lse in (False, True):
        for a, b in zip(grads("pallas", with_lse), grads("xla", with_lse)):
            np.testing.assert_allclose(a, b, rtol=t["rtol"], atol=t["atol"])
    text = jax.jit(lambda *a: jax.vjp(lambda *b: K.attention_res("ffi", *b)[0], *a[:3])[1](a[3])).lower(
        q, k, v, do).as_text()
    assert "custom_call @strata_attention_bwd_v1" in text


@pytest.mark.long
def test_gpt2_block_calls_the_attention_kernel() -> None:
    """The gpt2 kind's attention (no RoPE, same causal attention) goes through
    kernels.attention too: its plain block (through the custom_vjp) and its
    residual pair match the xla programs with pallas, and export custom calls
    with ffi (it once kept its einsums while the manifest named the kernel)."""
    from strata_jax import gpt2 as G

    base = tiny_model(block="gpt2", n_kv_heads=2, seq_len=20)
    ref = ModelConfig.from_dict(base)
    pal = ModelConfig.from_dict({**base, "kernels": {"attention": "pallas"}})
    p = G.gpt2_init(ref, jnp.uint32(3), jnp.int32(0), jnp.int32(2))
    p = {n: v + 0.01 if n in G.GPT2_ZEROS else v for n, v in p.items()}  # nonzero biases
    rng = np.random.default_rng(2)
    x, dy = (jnp.asarray(rng.normal(size=(2, 20, 32)), jnp.float32) for _ in range(2))
    plain = jax.jit(lambda c, *a: jax.vjp(lambda p_, x_: G.gpt2_fwd(c, p_, x_), *a[:2])[1](a[2]), static_argnums=0)
    # gpt2's key-bias gradient is 0 in exact arithmetic: bounded by the
    # summed magnitudes, not its own size (tests/tolerance.py).
    n = 2 * 20 + ref.d_model + ref.d_ff + 20
    TOL.assert_all_rounding_close(plain(pal, p, x, dy), plain(ref, p, x, dy), n=n, what="gpt2 vjp pallas vs xla")
    fwd = jax.jit(G.gpt2_fwd_res, static_argnums=0)
    bwd = jax.jit(G.gpt2_bwd_res, static_argnums=0)
    (y0, r0), (y1, r1) = fwd(ref, p, x), fwd(pal, p, x)
    TOL.assert_all_rounding_close(y1, y0, n=n, what="gpt2_fwd_res pallas vs xla")
    g0, g1 = bwd(ref, p, x, r0, dy), bwd(pal, p, x, r1, dy)
    TOL.assert_all_rounding_close(g1, g0, n=n, what="gpt2_bwd_res pallas vs xla")
    ffi = ModelConfig.from_dict({**base, "kernels": {"attention": "ffi"}})
    spec = jax.ShapeDtypeStruct((2, 20, 32), jnp.float32)
    pspec = {n: jax.ShapeDtypeStruct(v.shape, v.dtype) for n, v in p.items()}
    assert "custom_call @strata_attention_fwd_v1" in jax.jit(
        lambda p_, x_: G.gpt2_fwd(ffi, p_, x_)).lower(pspec, spec).as_text()
    (_, res) = jax.eval_shape(lambda p_, x_: G.gpt2_fwd_res(ffi, p_, x_), pspec, spec)
    assert "custom_call @strata_attention_bwd_v1" in jax.jit(
        lambda p_, x_, r, d: G.gpt2_bwd_res(ffi, p_, x_, r, d)).lower(pspec, spec, res, spec).as_text()


# --- attention's seg form (optional segment_ids) ------------------------------


def _segments(B: int, T: int, seed: int, scattered: bool = False) -> jax.Array:
    """[B, T] ids in runs: single tokens, short runs and runs across the
    32-token pallas tile; |scattered|: the last row's ids come back (a
    segment need not be contiguous in the contract)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((B, T), np.int32)
    for b in range(B):
        t, i = 0, 0
        while t < T:
            n = 1 if rng.random() < 0.3 else int(rng.integers(1, max(2, T // 2)))
            ids[b, t:t + n] = i
            t, i = t + n, i + 1
    if scattered and B > 1:
        ids[-1] = (np.arange(T) // 2) % 2
    return jnp.asarray(ids)


def _attention_f64(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """The contract's definition in float64: key j visible to query i iff
    j <= i and seg[b, i] == seg[b, j]."""
    H, KV, T, Dh = q.shape[2], k.shape[2], q.shape[1], q.shape[3]
    qq, kk, vv = (np.asarray(a, np.float64) for a in (q, np.repeat(k, H // KV, 2), np.repeat(v, H // KV, 2)))
    s = np.einsum("bqhd,bkhd->bhqk", qq, kk) / np.sqrt(Dh)
    sg = np.asarray(seg)
    vis = np.tril(np.ones((T, T), bool))[None, None] & (sg[:, None, :, None] == sg[:, None, None, :])
    s = np.where(vis, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    return np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), vv), (m + np.log(p.sum(-1, keepdims=True)))[..., 0]


def test_attention_segments_reference_is_the_definition() -> None:
    """attention_fwd_xla with segment ids against the definition in float64,
    its backward formula against autodiff, and one token per segment
    attending itself only."""
    q, k, v, do = _qkv(2, 45, 4, 2, 8, 5)
    seg = _segments(2, 45, 1, scattered=True)
    o, lse = K.attention_fwd_xla(q, k, v, seg)
    wo, wl = _attention_f64(q, k, v, seg)
    TOL.assert_all_rounding_close((o, lse), (wo, wl), n=45 + 8, what="seg attention vs float64")
    want = jax.vjp(lambda *a: K.attention_xla(*a, seg), q, k, v)[1](do)
    TOL.assert_all_rounding_close(K.attention_bwd_xla(q, k, v, o, lse, do, seg), want, n=45 + 8,
                                  what="seg attention bwd formula vs autodiff")
    own = jnp.arange(45, dtype=jnp.int32)[None].repeat(2, 0)
    np.testing.assert_allclose(K.attention_xla(q, k, v, own), jnp.repeat(v, 2, axis=2), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 8), (2, 33, 4, 2, 8),
                                   pytest.param((2, 70, 2, 1, 16), marks=pytest.mark.long)])
def test_pallas_attention_segments_match_reference(shape: tuple[int, ...]) -> None:
    """The seg form through pallas (forward, gradients, the residual halves)
    against xla at the contract's tolerance."""
    q, k, v, do = _qkv(*shape, seed=sum(shape) + 1)
    seg = _segments(shape[0], shape[1], sum(shape), scattered=True)
    t = _tol("attention", "fwd")
    for a, b in zip(jax.jit(K.attention_fwd_pallas)(q, k, v, seg), K.attention_fwd_xla(q, k, v, seg)):
        np.testing.assert_allclose(a, b, rtol=t["rtol"], atol=t["atol"])
    t = _tol("attention", "bwd")
    grads = jax.jit(lambda f, *a: jax.vjp(lambda x, y, z: f(x, y, z, a[3]), *a[:3])[1](a[4]),  # noqa: E731
                    static_argnums=0)
    want = grads(K.attention_xla, q, k, v, seg, do)
    for a, b in zip(grads(K.attention_pallas, q, k, v, seg, do), want):
        np.testing.assert_allclose(a, b, rtol=t["rtol"], atol=t["atol"])
    res = jax.jit(lambda *a: jax.vjp(lambda x, y, z: K.attention_res("pallas", x, y, z, a[3])[0], *a[:3])[1](a[4]))
    for a, b in zip(res(q, k, v, seg, do), want):
        np.testing.assert_allclose(a, b, rtol=t["rtol"], atol=t["atol"])


def test_attention_segments_call_their_own_targets_and_leave_the_plain_form_alone() -> None:
    """K.call with segment_ids lowers to the seg targets (the segment ids an
    s32 operand after v); without them, the same program as the plain form's
    halves always gave; s32 is the contract's dtype, another falls back."""
    import re
    q, k, v, do = _qkv(1, 20, 4, 2, 8, 9)
    seg = _segments(1, 20, 2)
    targets = lambda text: sorted(set(re.findall(r"custom_call @(\w+)", text)))  # noqa: E731
    seg_vjp = jax.jit(lambda *a: jax.vjp(lambda x, y, z: K.call("attention", "ffi", x, y, z, a[3]), *a[:3])[1](a[4]))
    text = seg_vjp.lower(q, k, v, seg, do).as_text()
    assert targets(text) == ["strata_attention_seg_bwd_v1", "strata_attention_seg_fwd_v1"], targets(text)
    assert re.search(r"custom_call @strata_attention_seg_fwd_v1\(%\S+, %\S+, %\S+, %\S+\).*tensor<1x20xi32>", text)
    res_bwd = jax.jit(lambda *a: K.attention_res_bwd("ffi", *a)).lower(q, k, v, q, jnp.zeros((1, 4, 20)), do, seg)
    assert targets(res_bwd.as_text()) == ["strata_attention_seg_bwd_v1"]
    plain = jax.jit(lambda *a: jax.vjp(lambda x, y, z: K.call("attention", "ffi", x, y, z), *a[:3])[1](a[3]))
    assert targets(plain.lower(q, k, v, do).as_text()) == ["strata_attention_bwd_v1", "strata_attention_fwd_v1"]
    K.fallbacks_seen.clear()
    K.call("attention", "ffi", q, k, v, seg.astype(jnp.uint32))
    assert K.fallbacks_seen and "segment_ids is uint32" in K.fallbacks_seen[0][3], K.fallbacks_seen
    K.fallbacks_seen.clear()


def test_verify_exports_the_seg_form(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """strata kernels verify's programs: per shape and implementation, the
    seg form's fwd and bwd cases beside the plain ones (segment_ids [B, T]
    s32 from q's shape, the attention tolerance), files named by the seg
    targets' keys."""
    from strata_jax import kernel_verify as KV
    index = KV.export(str(tmp_path), "attention", impl="ffi")
    seg = [c for c in index["cases"] if c.get("form") == "seg"]
    plain = [c for c in index["cases"] if "form" not in c]
    assert len(seg) == len(plain) == 2 * 2 * len(K.OPS["attention"]["verify_shapes"])
    c = [c for c in seg if c["impl"] == "ffi" and c["dir"] == "bwd"][1]
    assert c["input_kinds"] == ["q", "k", "v", "segment_ids", "do"]
    assert c["input_dtypes"] == ["f32", "f32", "f32", "s32", "f32"] and c["inputs"][3] == [2, 33]
    assert c["file"] == "programs/attention_ffi_seg_bwd_1.mlir" and len(c["outputs"]) == 3
    assert (c["rtol"], c["atol"]) == (_tol("attention", "bwd")["rtol"], _tol("attention", "bwd")["atol"])
