"""The `gpt2` block kind and family (docs/model.md, "Block kinds", gpt2).

GPT-2's block, pre-norm, biases on every linear, no RoPE (positions are the
embedding's: the gpt2 family adds learned position embeddings wpe to the
token embeddings, and its head is a LayerNorm with a bias before the
output projection; model.embed / model.final_norm):

    h = layer_norm(x, attn_norm, attn_norm_bias)
    q, k, v = h@wq + bq, h@wk + bk, h@wv + bv      (k, v with n_kv_heads heads)
    x = x + softmax(q·k / sqrt(Dh) + causal) · v @ wo + bo
    h = layer_norm(x, mlp_norm, mlp_norm_bias)
    x = x + gelu_tanh(h@w_fc + b_fc) @ w_proj + b_proj

LayerNorm: biased variance, epsilon 1e-5 (model.LN_EPS), f32. GELU: the
tanh approximation, 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))), GPT-2's.
Separate wq, wk, wv (GPT-2's checkpoints fuse them as c_attn [D, 3D]:
its columns cut in three) so that grouped-query attention works as in llama.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from . import layers as L
from . import llama
from .config import ModelConfig
from .layers import Params
from .registry import BlockKind

Array = jax.Array

GPT2_PARAMS: tuple[str, ...] = (
    "attn_norm", "attn_norm_bias", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo",
    "mlp_norm", "mlp_norm_bias", "w_fc", "b_fc", "w_proj", "b_proj",
)
GPT2_MATRICES: tuple[str, ...] = ("wq", "wk", "wv", "wo", "w_fc", "w_proj")
GPT2_RESIDUAL_OUT: frozenset[str] = frozenset({"wo", "w_proj"})
GPT2_ZEROS: frozenset[str] = frozenset({"attn_norm_bias", "bq", "bk", "bv", "bo", "mlp_norm_bias", "b_fc", "b_proj"})


def gpt2_shape(cfg: ModelConfig, local: str) -> tuple[int, ...]:
    D, F, KV = cfg.d_model, cfg.d_ff, cfg.kv_heads * cfg.head_dim
    own = {"attn_norm_bias": (D,), "bq": (D,), "bk": (KV,), "bv": (KV,), "bo": (D,), "mlp_norm_bias": (D,),
           "w_fc": (D, F), "b_fc": (F,), "w_proj": (F, D), "b_proj": (D,)}
    return own[local] if local in own else L.param_shape(cfg, local)


def gpt2_init(cfg: ModelConfig, seed: Array, layer: Array, n_layers: Array) -> Params:
    """llama's scheme (llama.init_matrices: one normal draw with the layer's
    key cut into GPT2_MATRICES, wo and w_proj scaled by 1/sqrt(2 N)); norm
    gains ones, biases zeros."""
    p = llama.init_matrices(cfg, KIND, seed, layer, n_layers, GPT2_MATRICES, GPT2_RESIDUAL_OUT)
    return {n: jnp.zeros_like(v) if n in GPT2_ZEROS else v for n, v in p.items()}


def _lin(cfg: ModelConfig, x: Array, w: Array, b: Array) -> Array:
    return L._mm(cfg, x, w) + b


def _qkv(cfg: ModelConfig, p: Params, h: Array) -> tuple[Array, Array, Array]:
    B, S, _ = h.shape
    H, Dh = cfg.n_heads, cfg.head_dim
    q = _lin(cfg, h, p["wq"], p["bq"]).reshape(B, S, H, Dh)
    k = _lin(cfg, h, p["wk"], p["bk"]).reshape(B, S, -1, Dh)
    v = _lin(cfg, h, p["wv"], p["bv"]).reshape(B, S, -1, Dh)
    return q, k, v


def _attend(cfg: ModelConfig, q: Array, k: Array, v: Array, seen: Array) -> Array:
    """softmax(q·k / sqrt(Dh), keys not |seen| at -1e30) · v, [B, S, D]; k, v
    with n_kv_heads heads (model.expand_kv)."""
    B, S, H, Dh = q.shape
    k, v = L.expand_kv(cfg, k), L.expand_kv(cfg, v)
    scores = L.cdot(cfg, "bqhd,bkhd->bhqk", q, k) / jnp.float32(math.sqrt(Dh))
    scores = jnp.where(seen, scores, jnp.float32(-1e30))
    probs = jax.nn.softmax(scores, axis=-1)
    return L.cdot(cfg, "bhqk,bkhd->bqhd", probs, v).reshape(B, S, H * Dh)


def _mlp(cfg: ModelConfig, p: Params, x: Array) -> Array:
    h = L.layer_norm(x, p["mlp_norm"], p["mlp_norm_bias"])
    return _lin(cfg, jax.nn.gelu(_lin(cfg, h, p["w_fc"], p["b_fc"]), approximate=True), p["w_proj"], p["b_proj"])


def _fwd_kv(cfg: ModelConfig, p: Params, x: Array) -> tuple[Array, Array, Array]:
    B, T, D = x.shape
    q, k, v = _qkv(cfg, p, L.layer_norm(x, p["attn_norm"], p["attn_norm_bias"]))
    impl = cfg.kernel("attention")
    if impl != "xla":
        # kernels.attention: the same causal attention, segmented under
        # packing (its contract's q, k "after RoPE" are simply q and k here:
        # gpt2 has no RoPE)
        a = L.kernel_attention(impl, q, k, v).reshape(B, T, D)
    else:
        a = _attend(cfg, q, k, v, L.attention_mask(T))
    x = x + _lin(cfg, a, p["wo"], p["bo"])
    return x + _mlp(cfg, p, x), k, v


def gpt2_fwd(cfg: ModelConfig, p: Params, x: Array) -> Array:
    """One gpt2 block: x [B,T,D] f32 -> y [B,T,D] f32."""
    return _fwd_kv(cfg, p, x)[0]


def gpt2_prefill(cfg: ModelConfig, p: Params, x: Array) -> tuple[Array, Array, Array]:
    """y and the layer's k, v caches [1, T, n_kv_heads, Dh]."""
    return _fwd_kv(cfg, p, x)


def gpt2_decode(cfg: ModelConfig, p: Params, x: Array, k_cache: Array, v_cache: Array,
                pos: Array) -> tuple[Array, Array, Array]:
    """One token x [1, 1, D] at position |pos|: its k and v written at |pos|,
    keys after |pos| masked as the causal mask does (llama.attention_decode)."""
    q, k, v = _qkv(cfg, p, L.layer_norm(x, p["attn_norm"], p["attn_norm_bias"]))
    zero = jnp.int32(0)
    k_cache = jax.lax.dynamic_update_slice(k_cache, k, (zero, pos, zero, zero))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v, (zero, pos, zero, zero))
    seen = (jnp.arange(cfg.seq_len, dtype=jnp.int32) <= pos)[None, None, None, :]
    x = x + _lin(cfg, _attend(cfg, q, k_cache, v_cache, seen), p["wo"], p["bo"])
    return x + _mlp(cfg, p, x), k_cache, v_cache


# --- the residual-keeping pair (sched.remat; docs/bundle.md) ------------------------
#
# Saved, as llama's block_fwd_res does: the matmul outputs the backward reads
# (q, k, v with their biases, the attention output before wo, the MLP's
# pre-GELU activation fc), the residual stream between the halves (x_mid)
# and the attention log-sum-exp; LayerNorm outputs and GELU are recomputed.
# Per token: 3 D (q, attn_out, x_mid) + 2 KV·Dh (k, v) + F (fc) + H (lse)
# values: 5 D + F + H without GQA, against llama's 5 D + 2 F + H (one fc, no gate/up pair).

GPT2_RESIDUALS: tuple[str, ...] = ("q", "k", "v", "attn_out", "attn_lse", "x_mid", "fc")


def gpt2_residuals(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], str]]:
    mb, T, D, H, Dh, F, KV = (cfg.microbatch_size, cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff,
                              cfg.kv_heads)
    shapes = {"q": (mb, T, H, Dh), "k": (mb, T, KV, Dh), "v": (mb, T, KV, Dh), "attn_out": (mb, T, D),
              "attn_lse": (mb, H, T), "x_mid": (mb, T, D), "fc": (mb, T, F)}
    return [(n, shapes[n], llama.residual_dtype(cfg, n)) for n in GPT2_RESIDUALS]


def gpt2_fwd_res(cfg: ModelConfig, p: Params, x: Array) -> tuple[Array, tuple[Array, ...]]:
    """y with gpt2_fwd's operations, and the residuals (GPT2_RESIDUALS order)."""
    q, k, v = _qkv(cfg, p, L.layer_norm(x, p["attn_norm"], p["attn_norm_bias"]))
    o, lse = llama.attention_fwd_res(cfg, q, k, v)
    x_mid = x + _lin(cfg, o, p["wo"], p["bo"])
    fc = _lin(cfg, L.layer_norm(x_mid, p["mlp_norm"], p["mlp_norm_bias"]), p["w_fc"], p["b_fc"])
    y = x_mid + _lin(cfg, jax.nn.gelu(fc, approximate=True), p["w_proj"], p["b_proj"])
    return y, (q, k, v, o, lse, x_mid, fc)


def gpt2_bwd_res(cfg: ModelConfig, p: Params, x: Array, res: tuple[Array, ...],
                 dy: Array) -> tuple[Params, Array]:
    """(param grads, dx) from the residuals, stage by stage (each jax.vjp's
    primal matmuls are dead code XLA removes); the attention core's backward
    is llama's (llama._attention_core_bwd: no RoPE inside it)."""
    q, k, v, o, lse, x_mid, fc = (r.astype(x.dtype) for r in res)  # f32 (bf16 residuals upcast)
    _, vjp = jax.vjp(lambda f_, w, b: _lin(cfg, jax.nn.gelu(f_, approximate=True), w, b), fc, p["w_proj"], p["b_proj"])
    dfc, dw_proj, db_proj = vjp(dy)
    _, vjp = jax.vjp(lambda x_, g, gb, w, b: _lin(cfg, L.layer_norm(x_, g, gb), w, b),
                     x_mid, p["mlp_norm"], p["mlp_norm_bias"], p["w_fc"], p["b_fc"])
    dx_mid_n, dmlp_norm, dmlp_norm_bias, dw_fc, db_fc = vjp(dfc)
    dx_mid = dy + dx_mid_n
    _, vjp = jax.vjp(lambda o_, w, b: _lin(cfg, o_, w, b), o, p["wo"], p["bo"])
    do, dwo, dbo = vjp(dx_mid)
    impl = cfg.kernel("attention")
    if impl != "xla":
        B, T, H, Dh = q.shape
        dq, dk, dv = (t.astype(x.dtype) for t in llama.kernel_attention_res_bwd(
            impl, q, k, v, o.reshape(B, T, H, Dh), lse, do.astype(jnp.float32).reshape(B, T, H, Dh)))
    else:
        dq, dk, dv = (t.astype(x.dtype) for t in llama._attention_core_bwd(cfg, q, k, v, o, lse, do))
    names = ("attn_norm", "attn_norm_bias", "wq", "bq", "wk", "bk", "wv", "bv")
    _, vjp = jax.vjp(lambda x_, *w: _qkv(cfg, dict(zip(names[2:], w[2:])),
                                          L.layer_norm(x_, w[0], w[1])), x, *(p[n] for n in names))
    dx_n, *dattn = vjp((dq, dk, dv))
    grads = dict(zip(names, dattn))
    grads.update({"wo": dwo, "bo": dbo, "mlp_norm": dmlp_norm, "mlp_norm_bias": dmlp_norm_bias, "w_fc": dw_fc,
                  "b_fc": db_fc, "w_proj": dw_proj, "b_proj": db_proj})
    return grads, dx_mid + dx_n


KIND = BlockKind(
    name="gpt2", params=lambda cfg: GPT2_PARAMS, init=gpt2_init, fwd=gpt2_fwd, shape=gpt2_shape,
    fwd_res=gpt2_fwd_res, bwd_res=gpt2_bwd_res, residuals=gpt2_residuals,
    prefill=gpt2_prefill, decode=gpt2_decode, family="gpt2", zeros=GPT2_ZEROS,
    residual_out=GPT2_RESIDUAL_OUT,
    doc="x += attn(layernorm(x)) (biases, no RoPE); x += gelu_tanh(layernorm(x)@w_fc + b_fc)@w_proj + b_proj")
