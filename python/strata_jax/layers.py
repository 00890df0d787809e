"""The transformer's layers, as pure functions on parameter dicts.

Everything here is shape-static and side-effect free so that the same
functions back both the exported per-layer programs (programs.py) and the
monolithic reference (model.py's whole model, reference_train.py). This is
the maths every block kind is built from (llama's block itself: block_fwd);
the whole model, which needs the registered kinds, is model.py's. See
docs/model.md.

Packed sequences (ModelConfig.packing == "pack", docs/model.md "Packing"):
the positions of a batch ([B, T] s32, 0 at each document's start) reach
the attention and RoPE through a trace-time context, not through every
kind's forward: `with packed(positions): ...` around the tracing of a
block (programs.py, the reference) makes `positions()` return them, and
rope_for / attention_mask / segment_ids read it. Outside such a block
`positions()` is None and every function traces exactly what it did before
packing existed (positions 0..T-1, the plain causal mask): so the concat
programs, generation (one sequence from position 0) and every kind that
never asks are unchanged. Only the forward's tracing reads the context:
custom-VJP backward rules get what they need as operands or residuals.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from typing import Iterator

import jax
import jax.numpy as jnp

from . import kernels as K
from .config import ModelConfig

Array = jax.Array
Params = dict[str, Array]

BLOCK_PARAMS: tuple[str, ...] = (
    "attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down",
)
BLOCK_MATRICES: tuple[str, ...] = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
RESIDUAL_OUT: frozenset[str] = frozenset({"wo", "w_down"})  # scaled by 1/sqrt(2 n_layers)
NORM_EPS = 1e-6
LN_EPS = 1e-5  # LayerNorm's epsilon (the gpt2 family: GPT-2's own value)


# --- parameter structure and init ------------------------------------------------

def param_shape(cfg: ModelConfig, local: str) -> tuple[int, ...]:
    """Shape of llama's parameter |local| and of the embedding's and head's
    (a kind with other parameters gives theirs: registry.BlockKind.shape)."""
    V, D, F = cfg.vocab_rows, cfg.d_model, cfg.d_ff
    KV = cfg.kv_heads * cfg.head_dim
    return {
        "wte": (V, D), "wpe": (cfg.seq_len, D), "attn_norm": (D,), "wq": (D, D), "wk": (D, KV), "wv": (D, KV),
        "wo": (D, D), "mlp_norm": (D,), "w_gate": (D, F), "w_up": (D, F), "w_down": (F, D),
        "final_norm": (D,), "final_norm_bias": (D,), "w_out": (D, V),
    }[local]


def normal(key: Array, shape: tuple[int, ...], std: float) -> Array:
    return jax.random.normal(key, shape, jnp.float32) * jnp.float32(std)


def init_block(cfg: ModelConfig, seed: Array, layer: Array, n_layers: Array) -> Params:
    # One normal draw for all seven matrices, cut in BLOCK_MATRICES order:
    # the threefry kernel is compiled once, not seven times (block_init was
    # the slowest program of a cold start to compile; docs/performance.md).
    # The depth is an input, not a constant: the residual-output scale is
    # computed on the device, so block_init's text (and its compiled
    # executable) is the same for every depth, like every other program.
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), 1), layer)
    sizes = [math.prod(param_shape(cfg, name)) for name in BLOCK_MATRICES]
    flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
    resid_std = jnp.float32(cfg.init_std) / jnp.sqrt(jnp.float32(2.0) * n_layers.astype(jnp.float32))
    mats: Params = {}
    offset = 0
    for name, size in zip(BLOCK_MATRICES, sizes):
        std = resid_std if name in RESIDUAL_OUT else jnp.float32(cfg.init_std)
        mats[name] = flat[offset:offset + size].reshape(param_shape(cfg, name)) * std
        offset += size
    out: Params = {}
    for name in BLOCK_PARAMS:
        out[name] = mats[name] if name in mats else jnp.ones(param_shape(cfg, name), jnp.float32)
    return out


# --- forward -------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _einsum_bf16(spec: str, a: Array, b: Array) -> Array:
    return jnp.einsum(spec, a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                      preferred_element_type=jnp.float32)


def _einsum_bf16_fwd(spec: str, a: Array, b: Array) -> tuple[Array, tuple[Array, Array]]:
    return _einsum_bf16(spec, a, b), (a, b)


def _einsum_bf16_bwd(spec: str, res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
    # JAX's own transpose of a bf16 dot with an f32 result multiplies the f32
    # cotangent by the bf16 operand upcast to f32: the backward's matmuls (two
    # thirds of a step's) would run in f32. Here both are bf16 x bf16 with f32
    # accumulation, like the forward (mixed precision's usual bf16 cotangent).
    a, b = res
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    g16, a16, b16 = g.astype(jnp.bfloat16), a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    da = _canonical_dot_bf16(f"{out},{sb}->{sa}", g16, b16)
    db = _canonical_dot_bf16(f"{sa},{out}->{sb}", a16, g16)
    return da.astype(a.dtype), db.astype(b.dtype)


def _canonical_dot_bf16(spec: str, a: Array, b: Array) -> Array:
    """einsum |spec| of bf16 a, b as one [batch, m, k] x [batch, k, n] -> f32 dot.

    XLA:CPU runs a bf16 x bf16 -> f32 dot only in this row-major form: one
    whose contracting dimension is not minor, or whose result XLA transposes
    by layout, fails at run time ("Unsupported element type for
    DotThunk::Execute"). The barriers keep XLA from folding the transposes
    back into the dot."""
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    batch = [c for c in out if c in sa and c in sb]
    contract = [c for c in sa if c in sb and c not in out]
    free_a = [c for c in sa if c not in sb]
    free_b = [c for c in sb if c not in sa]
    size = {**dict(zip(sa, a.shape)), **dict(zip(sb, b.shape))}
    n = lambda cs: math.prod(size[c] for c in cs)  # noqa: E731
    at = jnp.transpose(a, [sa.index(c) for c in batch + free_a + contract])
    bt = jnp.transpose(b, [sb.index(c) for c in batch + contract + free_b])
    at, bt = jax.lax.optimization_barrier((at.reshape(n(batch), n(free_a), n(contract)),
                                           bt.reshape(n(batch), n(contract), n(free_b))))
    r = jax.lax.dot_general(at, bt, (((2,), (1,)), ((0,), (0,))), preferred_element_type=jnp.float32)
    r = jax.lax.optimization_barrier(r).reshape([size[c] for c in batch + free_a + free_b])
    return jnp.transpose(r, [(batch + free_a + free_b).index(c) for c in out])


_einsum_bf16.defvjp(_einsum_bf16_fwd, _einsum_bf16_bwd)


def cdot(cfg: ModelConfig, spec: str, a: Array, b: Array) -> Array:
    """einsum |spec| (two operands, every index of one operand also in the other
    or in the result) in compute dtype, f32 result. bf16: forward and backward
    matmuls take bf16 operands (_einsum_bf16_bwd); f32: a plain einsum."""
    if cfg.compute_dtype == "bf16":
        return _einsum_bf16(spec, a, b)
    c = cfg.cdtype
    return jnp.einsum(spec, a.astype(c), b.astype(c), preferred_element_type=jnp.float32)


def _mm(cfg: ModelConfig, a: Array, b: Array) -> Array:
    """Matmul over the last dim of a / first dim of b in compute dtype, f32 result."""
    if cfg.compute_dtype == "bf16":
        lead = "abcdefgh"[:a.ndim - 1]
        return _einsum_bf16(f"{lead}k,kn->{lead}n", a, b)
    return jnp.matmul(a.astype(cfg.cdtype), b.astype(cfg.cdtype),
                      preferred_element_type=jnp.float32)


def layer_norm(x: Array, gain: Array, bias: Array) -> Array:
    """LayerNorm over the last axis, in f32 (biased variance, LN_EPS)."""
    x = x.astype(jnp.float32)
    mu = jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    return xc * jax.lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + LN_EPS) * gain + bias


def rms_norm(x: Array, gain: Array) -> Array:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + NORM_EPS) * gain


def norm(cfg: ModelConfig, x: Array, gain: Array) -> Array:
    """RMSNorm through the implementation kernels.rmsnorm selects (kernels.py)."""
    impl = cfg.kernel("rmsnorm")
    return rms_norm(x, gain) if impl == "xla" else K.call("rmsnorm", impl, x.astype(jnp.float32), gain)


def swiglu(cfg: ModelConfig, gate: Array, up: Array) -> Array:
    """silu(gate) * up through the implementation kernels.swiglu selects."""
    impl = cfg.kernel("swiglu")
    return jax.nn.silu(gate) * up if impl == "xla" else K.call("swiglu", impl, gate, up)


def rope_tables(cfg: ModelConfig) -> tuple[Array, Array]:
    """cos, sin of shape [T, Dh] (rotate-half layout: the half-table repeated)."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(half, dtype=jnp.float32) * 2.0 / cfg.head_dim))
    ang = jnp.arange(cfg.seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    ang = jnp.concatenate([ang, ang], axis=-1)
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """x: [B, T, H, Dh] f32; cos/sin: [T, Dh], or [B, T, Dh] (per-token
    positions: rope_for under packing)."""
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    if cos.ndim == 3:
        return x * cos[:, :, None, :] + rot * sin[:, :, None, :]
    return x * cos[None, :, None, :] + rot * sin[None, :, None, :]


# --- packed sequences: positions, the segment mask ------------------------------

_POSITIONS: contextvars.ContextVar[Array | None] = contextvars.ContextVar("strata_positions", default=None)


@contextlib.contextmanager
def packed(pos: Array | None) -> Iterator[None]:
    """While tracing inside it, attention and RoPE use |pos| ([B, T] s32, the
    position of each token in its document; None: 0..T-1 and plain causal)."""
    token = _POSITIONS.set(pos)
    try:
        yield
    finally:
        _POSITIONS.reset(token)


def positions() -> Array | None:
    """The positions set by the enclosing packed(), or None."""
    return _POSITIONS.get()


def rope_for(cfg: ModelConfig) -> tuple[Array, Array]:
    """cos, sin for the tokens being traced: rope_tables as they are ([T, Dh])
    without positions, else gathered at each token's position ([B, T, Dh])."""
    cos, sin = rope_tables(cfg)
    pos = positions()
    if pos is None:
        return cos, sin
    return jnp.take(cos, pos, axis=0), jnp.take(sin, pos, axis=0)


def attention_mask(T: int) -> Array:
    """Where query i may read key j, broadcastable against scores [B, H, T, T]:
    causal (j <= i), and under packing also j >= i - pos[i] (the same
    document: a document starts exactly where its position is 0)."""
    causal = jnp.tril(jnp.ones((T, T), dtype=jnp.bool_))
    pos = positions()
    if pos is None:
        return causal[None, None]
    i = jnp.arange(T, dtype=jnp.int32)
    start = i[None, :] - pos.astype(jnp.int32)  # [B, T]: the first key each query reads
    return (causal[None] & (i[None, None, :] >= start[:, :, None]))[:, None]


def segment_ids() -> Array | None:
    """The kernels' segment ids [B, T] s32 of the traced positions
    (cumsum(pos == 0) - 1, the contract's "segment_ids"), or None."""
    pos = positions()
    if pos is None:
        return None
    return (jnp.cumsum((pos == 0).astype(jnp.int32), axis=1) - 1).astype(jnp.int32)


def kernel_attention(impl: str, q: Array, k: Array, v: Array) -> Array:
    """kernels.attention through |impl|: the segmented form under packing."""
    seg = segment_ids()
    if seg is None:
        return K.call("attention", impl, q, k, v)
    return K.call("attention", impl, q, k, v, seg)


def expand_kv(cfg: ModelConfig, t: Array) -> Array:
    """[B, T, KV, Dh] keys or values -> [B, T, KV * g, Dh], each head repeated
    g = n_heads / n_kv_heads times (query head h reads key/value head h // g).
    The identity without grouped-query attention, so those programs are
    unchanged. g is the same on a tensor-parallel device's share of heads."""
    g = cfg.n_heads // cfg.kv_heads
    return t if g == 1 else jnp.repeat(t, g, axis=2)


def attention(cfg: ModelConfig, p: Params, x: Array) -> Array:
    B, T, D = x.shape
    H, Dh = cfg.n_heads, cfg.head_dim
    q = _mm(cfg, x, p["wq"]).reshape(B, T, H, Dh)
    k = _mm(cfg, x, p["wk"]).reshape(B, T, -1, Dh)
    v = _mm(cfg, x, p["wv"]).reshape(B, T, -1, Dh)
    cos, sin = rope_for(cfg)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    impl = cfg.kernel("attention")
    if impl != "xla":
        # The kernel op (kernels.py, contract row "attention"): k and v keep
        # their n_kv_heads heads; f32 whatever compute_dtype (q, k, v are f32 here).
        return _mm(cfg, kernel_attention(impl, q, k, v).reshape(B, T, D), p["wo"])
    k, v = expand_kv(cfg, k), expand_kv(cfg, v)
    scores = cdot(cfg, "bqhd,bkhd->bhqk", q, k) / jnp.float32(math.sqrt(Dh))
    scores = jnp.where(attention_mask(T), scores, jnp.float32(-1e30))
    probs = jax.nn.softmax(scores, axis=-1)
    out = cdot(cfg, "bhqk,bkhd->bqhd", probs, v).reshape(B, T, D)
    return _mm(cfg, out, p["wo"])


def mlp(cfg: ModelConfig, p: Params, x: Array) -> Array:
    return _mm(cfg, swiglu(cfg, _mm(cfg, x, p["w_gate"]), _mm(cfg, x, p["w_up"])), p["w_down"])


def block_fwd(cfg: ModelConfig, p: Params, x: Array) -> Array:
    """One transformer block: x [B,T,D] f32 -> y [B,T,D] f32."""
    x = x + attention(cfg, p, norm(cfg, x, p["attn_norm"]))
    return x + mlp(cfg, p, norm(cfg, x, p["mlp_norm"]))


def embed_fwd(cfg: ModelConfig, wte: Array, tokens: Array) -> Array:
    del cfg
    return jnp.take(wte, tokens, axis=0).astype(jnp.float32)


def mask_padding(cfg: ModelConfig, logits: Array) -> Array:
    """Logits of the padding ids (vocab_size .. vocab_padded - 1) replaced by
    -1e30: after the f32 log-softmax they weigh exactly 0 and get no gradient."""
    if cfg.vocab_rows == cfg.vocab_size:
        return logits
    real = jnp.arange(cfg.vocab_rows) < cfg.vocab_size
    return jnp.where(real, logits, jnp.float32(-1e30))


def masked_ce(logits: Array, targets: Array, mask: Array) -> Array:
    """sum(cross_entropy * mask) / sum(mask), log-softmax in f32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    ce = -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    mask = mask.astype(jnp.float32)
    return jnp.sum(ce * mask) / jnp.sum(mask)


def weighted_ce(logits: Array, targets: Array, mask: Array) -> Array:
    """sum(cross_entropy * mask) / mask.size (packing none or pack: the trainer
    scales by mask.size / the global batch's sum of weights)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    ce = -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.sum(ce * mask.astype(jnp.float32)) / jnp.float32(mask.size)
