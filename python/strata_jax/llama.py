"""llama's block programs beyond its forward (layers.block_fwd): the
residual-keeping pair and batch-1 generation, and the pieces other kinds
build theirs from (attention with its log-sum-exp and its backward, cached
attention, the init scheme).

Tensor parallelism runs these very functions on one device's heads and
hidden units: `Collectives` names the two points where a device meets its
tensor group (Megatron's f and g, tensor_parallel.py); on one device both
are the identity, which adds nothing to the traced program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp

from . import kernels as K
from . import layers as L
from .config import ModelConfig
from .layers import Params
from .registry import BlockKind

Array = jax.Array


def _identity(x: Array) -> Array:
    return x


@dataclass(frozen=True)
class Collectives:
    """Megatron's f (copy_in: identity forward, all-reduce of the gradient
    over the tensor group) at each normalised input of a column-parallel
    projection, and g (reduce_out: all-reduce forward, identity backward)
    after each row-parallel one."""
    copy_in: Callable[[Array], Array] = _identity
    reduce_out: Callable[[Array], Array] = _identity


ONE_DEVICE = Collectives()


def init_matrices(cfg: ModelConfig, kind: BlockKind, seed: Array, layer: Array, n_layers: Array,
                  matrices: tuple[str, ...], resid_out: frozenset[str]) -> Params:
    """Llama's init scheme for any kind: key fold_in(fold_in(PRNGKey(seed), 1), layer),
    one normal draw cut into |matrices| in order, each times init_std (those of
    |resid_out| times init_std / sqrt(2 n_layers)); every other parameter ones."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), 1), layer)
    sizes = [math.prod(kind.param_shape(cfg, n)) for n in matrices]
    flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
    resid_std = jnp.float32(cfg.init_std) / jnp.sqrt(jnp.float32(2.0) * n_layers.astype(jnp.float32))
    out: Params = {}
    offset = 0
    for name, size in zip(matrices, sizes):
        std = resid_std if name in resid_out else jnp.float32(cfg.init_std)
        out[name] = flat[offset:offset + size].reshape(kind.param_shape(cfg, name)) * std
        offset += size
    return {n: out[n] if n in out else jnp.ones(kind.param_shape(cfg, n), jnp.float32) for n in kind.params(cfg)}


# --- residual-keeping block programs (sched.remat) -------------------------------
#
# block_fwd_res returns y and the residuals the backward needs; block_bwd_res
# consumes them instead of recomputing the forward from x. What is saved: every
# matmul output the backward reads (q and k after RoPE, v, the attention output
# before wo, the MLP gate and up projections), the residual stream between the
# two halves (x_mid) and the attention log-sum-exp (one f32 per query and head,
# instead of the [T, T] probabilities). RMSNorm outputs and elementwise
# functions are recomputed from x and x_mid: cheap, and it keeps the saved set
# at 5 D + 2 F + H floats per token (JAX's "dots saveable" choice, with a
# flash-attention style softmax backward). block_fwd_res computes y with the
# very operations of model.block_fwd, in the same order.

RESIDUALS: tuple[str, ...] = ("q", "k", "v", "attn_out", "attn_lse", "x_mid", "gate", "up")


def residuals(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of each residual, in RESIDUALS order (BlockKind.residuals)."""
    mb, T, D, H, Dh, F = cfg.microbatch_size, cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff
    KV = cfg.kv_heads  # k and v are kept before expand_kv: n_kv_heads heads
    shapes = {"q": (mb, T, H, Dh), "k": (mb, T, KV, Dh), "v": (mb, T, KV, Dh), "attn_out": (mb, T, D),
              "attn_lse": (mb, H, T), "x_mid": (mb, T, D), "gate": (mb, T, F), "up": (mb, T, F)}
    return [(n, shapes[n], residual_dtype(cfg, n)) for n in RESIDUALS]


# Residuals that only ever reach a matmul as a bf16 operand (or, for gate and
# up, the elementwise SwiGLU backward) are kept in the compute dtype: with bf16
# they take half the bytes. The residual stream x_mid and the softmax's
# log-sum-exp stay f32 (docs/model.md, "Mixed precision").
_F32_RESIDUALS = frozenset({"attn_lse", "x_mid"})


def residual_dtype(cfg: ModelConfig, name: str) -> str:
    return "f32" if name in _F32_RESIDUALS else cfg.compute_dtype


def _qkv(cfg: ModelConfig, p: dict[str, Array], x: Array,
         tp: Collectives = ONE_DEVICE) -> tuple[Array, Array, Array]:
    """RMSNorm, q/k/v projections and RoPE, as in layers.attention (with
    tensor parallelism, on this device's heads: wq, wk, wv are its column
    blocks)."""
    B, T, _ = x.shape
    Dh = cfg.head_dim
    h = tp.copy_in(L.norm(cfg, x, p["attn_norm"]))
    q = L._mm(cfg, h, p["wq"]).reshape(B, T, -1, Dh)
    k = L._mm(cfg, h, p["wk"]).reshape(B, T, -1, Dh)
    v = L._mm(cfg, h, p["wv"]).reshape(B, T, -1, Dh)
    cos, sin = L.rope_for(cfg)
    return L.apply_rope(q, cos, sin), L.apply_rope(k, cos, sin), v


def _scores(cfg: ModelConfig, q: Array, k: Array) -> Array:
    """Masked scores (causal; under packing also within the document:
    layers.attention_mask); |k| has n_kv_heads heads (expanded here, model.expand_kv)."""
    c = cfg.cdtype
    k = L.expand_kv(cfg, k)
    s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(c), k.astype(c),
                   preferred_element_type=jnp.float32) / jnp.float32(math.sqrt(cfg.head_dim))
    return jnp.where(L.attention_mask(q.shape[1]), s, jnp.float32(-1e30))


def kernel_attention_res(impl: str, q: Array, k: Array, v: Array) -> tuple[Array, Array]:
    """kernels.attention_res (o, lse) through |impl|; under packing with the
    segment ids of the traced positions (layers.segment_ids) as a last operand."""
    seg = L.segment_ids()
    if seg is None:
        return K.attention_res(impl, q, k, v)
    return K.attention_res(impl, q, k, v, seg)


def kernel_attention_res_bwd(impl: str, q: Array, k: Array, v: Array, o: Array, lse: Array,
                             do: Array) -> tuple[Array, Array, Array]:
    """kernels.attention_res_bwd (dq, dk, dv), with the segment ids under packing."""
    seg = L.segment_ids()
    if seg is None:
        return K.attention_res_bwd(impl, q, k, v, o, lse, do)
    return K.attention_res_bwd(impl, q, k, v, o, lse, do, seg)


def attention_fwd_res(cfg: ModelConfig, q: Array, k: Array, v: Array) -> tuple[Array, Array]:
    """o [B, T, heads * Dh] and the log-sum-exp [B, heads, T] of causal
    attention on q [B, T, heads, Dh] after RoPE (k, v: their key/value
    heads), through kernels.attention: the residual forms of every kind's
    block (llama, gpt2, and a tensor-parallel device's heads, which are
    whole key/value groups: the contract's sharding)."""
    B, T = q.shape[:2]
    impl = cfg.kernel("attention")
    if impl != "xla":
        # The kernel's forward target gives o and lse (kernels.attention_res).
        o, lse = kernel_attention_res(impl, q, k, v)
        return o.reshape(B, T, -1), lse
    scores = _scores(cfg, q, k)
    probs = jax.nn.softmax(scores, axis=-1)
    lse = jax.nn.logsumexp(scores, axis=-1)
    c = cfg.cdtype
    o = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(c), L.expand_kv(cfg, v).astype(c),
                   preferred_element_type=jnp.float32).reshape(B, T, -1)
    return o, lse


def block_fwd_res(cfg: ModelConfig, p: dict[str, Array], x: Array,
                  tp: Collectives = ONE_DEVICE) -> tuple[Array, tuple[Array, ...]]:
    """y and the residuals (RESIDUALS order). With tensor parallelism (|tp|)
    on this device's heads and hidden units: y is whole (all-reduced), the
    residuals are this device's part."""
    q, k, v = _qkv(cfg, p, x, tp)
    o, lse = attention_fwd_res(cfg, q, k, v)
    x_mid = x + tp.reduce_out(L._mm(cfg, o, p["wo"]))
    h2 = tp.copy_in(L.norm(cfg, x_mid, p["mlp_norm"]))
    gate, up = L._mm(cfg, h2, p["w_gate"]), L._mm(cfg, h2, p["w_up"])
    y = x_mid + tp.reduce_out(L._mm(cfg, L.swiglu(cfg, gate, up), p["w_down"]))
    return y, (q, k, v, o, lse, x_mid, gate, up)


def _attention_core_bwd(cfg: ModelConfig, q: Array, k: Array, v: Array, o: Array, lse: Array,
                        do: Array) -> tuple[Array, Array, Array]:
    """Gradients of o = softmax(q k / sqrt(Dh) + mask) v from the saved log-sum-exp:
    p = exp(s - lse), ds = p (dp - rowsum(do * o)) (the softmax Jacobian without [T, T] residuals).
    k and v have n_kv_heads heads: their gradients are summed over the query
    heads that share them (the transpose of model.expand_kv)."""
    B, T, H, Dh = q.shape
    KV = k.shape[2]
    c = cfg.cdtype
    ks, v = k, L.expand_kv(cfg, v)
    do4, o4 = do.reshape(B, T, H, Dh), o.reshape(B, T, H, Dh)
    probs = jnp.exp(_scores(cfg, q, k) - lse[..., None])
    dv = jnp.einsum("bhqk,bqhd->bkhd", probs.astype(c), do4.astype(c), preferred_element_type=jnp.float32)
    dp = jnp.einsum("bqhd,bkhd->bhqk", do4.astype(c), v.astype(c), preferred_element_type=jnp.float32)
    delta = jnp.transpose(jnp.sum(do4 * o4, axis=-1), (0, 2, 1))  # [B, H, T]
    ds = probs * (dp - delta[..., None]) / jnp.float32(math.sqrt(Dh))
    dq = jnp.einsum("bhqk,bkhd->bqhd", ds.astype(c), L.expand_kv(cfg, ks).astype(c), preferred_element_type=jnp.float32)
    dk = jnp.einsum("bhqk,bqhd->bkhd", ds.astype(c), q.astype(c), preferred_element_type=jnp.float32)
    if KV != H:
        dk = dk.reshape(B, T, KV, H // KV, Dh).sum(axis=3)
        dv = dv.reshape(B, T, KV, H // KV, Dh).sum(axis=3)
    return dq, dk, dv


def block_bwd_res(cfg: ModelConfig, p: dict[str, Array], x: Array, res: tuple[Array, ...],
                  dy: Array, tp: Collectives = ONE_DEVICE) -> tuple[dict[str, Array], Array]:
    """(param grads, dx) from the residuals. Each jax.vjp below covers one stage whose
    inputs are saved; its primal matmuls are dead code that XLA removes. With
    tensor parallelism (|tp|) the stages are the same on this device's part,
    and the gradient into each normalised input is all-reduced (copy_in's
    backward) before the RMSNorm backward."""
    q, k, v, o, lse, x_mid, gate, up = (r.astype(jnp.float32) for r in res)
    _, vjp = jax.vjp(lambda g_, u_, w: L._mm(cfg, L.swiglu(cfg, g_, u_), w), gate, up, p["w_down"])
    dgate, dup, dw_down = vjp(dy)

    def mlp_in(x_, gain, wg, wu):  # type: ignore[no-untyped-def]
        h = tp.copy_in(L.norm(cfg, x_, gain))
        return L._mm(cfg, h, wg), L._mm(cfg, h, wu)

    _, vjp = jax.vjp(mlp_in, x_mid, p["mlp_norm"], p["w_gate"], p["w_up"])
    dx_mid_n, dmlp_norm, dw_gate, dw_up = vjp((dgate, dup))
    dx_mid = dy + dx_mid_n
    _, vjp = jax.vjp(lambda o_, w: L._mm(cfg, o_, w), o, p["wo"])
    do, dwo = vjp(dx_mid)
    impl = cfg.kernel("attention")
    if impl != "xla":
        # The kernel's backward target in place of _attention_core_bwd's einsums.
        B, T, H, Dh = q.shape
        dq, dk, dv = kernel_attention_res_bwd(impl, q, k, v, o.reshape(B, T, H, Dh), lse, do.reshape(B, T, H, Dh))
    else:
        dq, dk, dv = _attention_core_bwd(cfg, q, k, v, o, lse, do)
    _, vjp = jax.vjp(lambda x_, gain, wq, wk, wv: _qkv(cfg, {"attn_norm": gain, "wq": wq, "wk": wk, "wv": wv}, x_, tp),
                     x, p["attn_norm"], p["wq"], p["wk"], p["wv"])
    dx_n, dattn_norm, dwq, dwk, dwv = vjp((dq, dk, dv))
    grads = {"attn_norm": dattn_norm, "wq": dwq, "wk": dwk, "wv": dwv, "wo": dwo, "mlp_norm": dmlp_norm,
             "w_gate": dw_gate, "w_up": dw_up, "w_down": dw_down}
    return grads, dx_mid + dx_n


# --- batch-1 generation programs (strata sample) ----------------------------------
#
# Autoregressive generation with a per-layer KV cache, driven layer by layer
# from C like training (docs/bundle.md, "Generation programs"): the prompt
# but its last token goes through embed_prefill and every layer's
# block_prefill, which return the layer's keys and values for all T
# positions (positions past the prompt hold values of padding tokens that
# no query ever attends to); then each token goes through embed_decode,
# every layer's block_decode (writes its key and value at |pos|, attends
# positions <= pos) and head_logits. Batch 1, whatever microbatch_size.

def block_prefill(cfg: ModelConfig, p: dict[str, Array], x: Array) -> tuple[Array, Array, Array]:
    """y and the layer's k (after RoPE) and v caches [1, T, H, Dh], with
    block_fwd_res's operations (its other residuals are dead code)."""
    y, res = block_fwd_res(cfg, p, x)
    return y, res[1], res[2]


def attention_decode(cfg: ModelConfig, p: dict[str, Array], h: Array, k_cache: Array, v_cache: Array,
                     pos: Array) -> tuple[Array, Array, Array]:
    """Attention of one normalised token h [1, 1, D] at position |pos| (s32
    scalar, < T), its output projection included, and the caches [1, T,
    n_kv_heads, Dh] with this token's k and v written at |pos|. RoPE at
    |pos|, and scores of keys after |pos| replaced by -1e30 before the
    softmax, exactly as the causal mask does, so they weigh exactly 0."""
    B, S, D = h.shape
    H, Dh, T = cfg.n_heads, cfg.head_dim, cfg.seq_len
    q = L._mm(cfg, h, p["wq"]).reshape(B, S, H, Dh)
    k = L._mm(cfg, h, p["wk"]).reshape(B, S, -1, Dh)
    v = L._mm(cfg, h, p["wv"]).reshape(B, S, -1, Dh)
    cos, sin = L.rope_tables(cfg)
    cos1, sin1 = jax.lax.dynamic_slice_in_dim(cos, pos, 1, 0), jax.lax.dynamic_slice_in_dim(sin, pos, 1, 0)
    q, k = L.apply_rope(q, cos1, sin1), L.apply_rope(k, cos1, sin1)
    zero = jnp.int32(0)
    k_cache = jax.lax.dynamic_update_slice(k_cache, k, (zero, pos, zero, zero))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v, (zero, pos, zero, zero))
    c = cfg.cdtype
    s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(c), L.expand_kv(cfg, k_cache).astype(c),
                   preferred_element_type=jnp.float32) / jnp.float32(math.sqrt(Dh))
    seen = jnp.arange(T, dtype=jnp.int32) <= pos
    s = jnp.where(seen[None, None, None, :], s, jnp.float32(-1e30))
    probs = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(c), L.expand_kv(cfg, v_cache).astype(c),
                   preferred_element_type=jnp.float32).reshape(B, S, D)
    return L._mm(cfg, o, p["wo"]), k_cache, v_cache


def block_decode(cfg: ModelConfig, p: dict[str, Array], x: Array, k_cache: Array, v_cache: Array,
                 pos: Array) -> tuple[Array, Array, Array]:
    """One token x [1, 1, D] at position |pos|: y and the caches with this
    token's k and v written at |pos| (attention_decode); the same operations
    as model.block_fwd for that token."""
    a, k_cache, v_cache = attention_decode(cfg, p, L.norm(cfg, x, p["attn_norm"]), k_cache, v_cache, pos)
    x_mid = x + a
    y = x_mid + L.mlp(cfg, p, L.norm(cfg, x_mid, p["mlp_norm"]))
    return y, k_cache, v_cache
