"""The `moe` block: llama's attention, then a top-k routed mixture of SwiGLU experts.

Pure, shape-static functions on parameter dicts, like model.py, so the same
code can back exported per-layer programs and the monolithic reference.
docs/model.md ("Block kinds", moe) states the maths; in short, for the tokens
h [N, D] of a microbatch (N = mb·T) after the MLP norm:

    logits = h @ router                       f32 [N, E] (router always in f32)
    probs  = softmax(logits)                  f32 [N, E]
    idx    = top_k(probs, k)                  ties: the lower expert index first
    gate   = probs[idx]                       NOT renormalised (Switch; see below)
    out_n  = Σ_{e in idx_n} gate_{n,e} · SwiGLU_e(h_n)
    f_e    = #{(n, j): idx_{n,j} = e} / (N·k)      fraction of assignments, Σ f = 1
    P_e    = mean_n probs_{n,e}
    aux    = E · Σ_e f_e · P_e                      1 when routing is uniform
    z      = mean_n logsumexp(logits_n)²

The block's training objective is `aux_weight·aux + z_weight·z`, added to
the head's loss once per MoE layer. Gates are the softmax probabilities of
the chosen experts, not renormalised over the k chosen ones (Switch
Transformer; Mixtral renormalises): with k = 1 a renormalised gate is the
constant 1 and the router would learn only from the auxiliary losses.

Dispatch is dense: every expert runs on every token and a [N, E] combine
matrix, zero outside each token's top k, mixes the results. That is simple,
static-shaped and exact, and costs E/k times the expert FLOPs a sparse
dispatch would (and an [E, N, F] hidden activation instead of [k·N, F]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from . import layers as L
from . import llama
from .config import ModelConfig
from .registry import BlockKind

Array = jax.Array
Params = dict[str, Array]

MOE_PARAMS: tuple[str, ...] = (
    "attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "router", "w_gate", "w_up", "w_down",
)
MOE_MATRICES: tuple[str, ...] = ("wq", "wk", "wv", "wo", "router", "w_gate", "w_up", "w_down")
MOE_RESIDUAL_OUT: frozenset[str] = frozenset({"wo", "w_down"})
# The block's extra forward outputs, in order: aux, z (scalars), load [E].
MOE_STATS: tuple[str, ...] = ("aux_loss", "z_loss", "expert_load")


@dataclass(frozen=True)
class MoeConfig:
    n_experts: int
    top_k: int
    aux_weight: float
    z_weight: float

    def __post_init__(self) -> None:
        if self.n_experts < 1:
            raise ValueError(f"model.n_experts must be >= 1 (got {self.n_experts})")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"model.moe_top_k must be in 1..model.n_experts={self.n_experts} "
                             f"(got {self.top_k})")
        if self.aux_weight < 0 or self.z_weight < 0:
            raise ValueError(f"model.moe_aux_weight and model.moe_z_weight must be >= 0 "
                             f"(got {self.aux_weight}, {self.z_weight})")

    @classmethod
    def of(cls, cfg: ModelConfig) -> "MoeConfig":
        return cls(n_experts=cfg.n_experts, top_k=cfg.moe_top_k, aux_weight=cfg.moe_aux_weight,
                   z_weight=cfg.moe_z_weight)


def moe_param_shape(cfg: ModelConfig, mc: MoeConfig, local: str) -> tuple[int, ...]:
    D, F, E = cfg.d_model, cfg.d_ff, mc.n_experts
    experts = {"router": (D, E), "w_gate": (E, D, F), "w_up": (E, D, F), "w_down": (E, F, D)}
    return experts[local] if local in experts else L.param_shape(cfg, local)


def init_moe_block(cfg: ModelConfig, mc: MoeConfig, seed: Array, layer: Array,
                   n_layers: Array) -> Params:
    """As model.init_block: one normal draw cut in MOE_MATRICES order, the same
    per-layer key (a layer is either kind, never both), residual outputs
    scaled by 1/sqrt(2·n_layers) computed on the device."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), 1), layer)
    sizes = [math.prod(moe_param_shape(cfg, mc, n)) for n in MOE_MATRICES]
    flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
    resid_std = jnp.float32(cfg.init_std) / jnp.sqrt(jnp.float32(2.0) * n_layers.astype(jnp.float32))
    out: Params = {}
    offset = 0
    for name, size in zip(MOE_MATRICES, sizes):
        std = resid_std if name in MOE_RESIDUAL_OUT else jnp.float32(cfg.init_std)
        out[name] = flat[offset:offset + size].reshape(moe_param_shape(cfg, mc, name)) * std
        offset += size
    return {n: out[n] if n in out else jnp.ones(moe_param_shape(cfg, mc, n), jnp.float32)
            for n in MOE_PARAMS}


def route(mc: MoeConfig, logits: Array) -> tuple[Array, Array, Array]:
    """logits [N, E] -> probs [N, E], combine [N, E] (gate where chosen, else 0),
    chosen [N, E] (1.0 where chosen: a constant for the gradient)."""
    probs = jax.nn.softmax(logits, axis=-1)
    _, idx = jax.lax.top_k(jax.lax.stop_gradient(probs), mc.top_k)
    chosen = jnp.sum(jax.nn.one_hot(idx, mc.n_experts, dtype=logits.dtype), axis=-2)
    return probs, probs * chosen, chosen


def moe_losses(mc: MoeConfig, logits: Array, probs: Array, chosen: Array) -> tuple[Array, Array, Array]:
    """aux (Switch load balancing), z (router z-loss), load f [E]."""
    n = logits.shape[0]
    load = jnp.sum(chosen, axis=0) / (n * mc.top_k)
    importance = jnp.mean(probs, axis=0)
    aux = mc.n_experts * jnp.sum(load * importance)
    z = jnp.mean(jnp.square(jax.nn.logsumexp(logits, axis=-1)))
    return aux, z, load


def _emm(cfg: ModelConfig, spec: str, a: Array, b: Array) -> Array:
    """einsum in the compute dtype with an f32 result (f64 stays f64: tests)."""
    if a.dtype == jnp.float64:
        return jnp.einsum(spec, a, b)
    c = cfg.cdtype
    return jnp.einsum(spec, a.astype(c), b.astype(c), preferred_element_type=jnp.float32)


def moe_mlp(cfg: ModelConfig, mc: MoeConfig, p: Params, h: Array) -> tuple[Array, Array, Array, Array]:
    """h [..., D] (normed) -> out [..., D], aux, z, load [E]. Dense dispatch."""
    lead, D = h.shape[:-1], h.shape[-1]
    hn = h.reshape(-1, D)
    logits = jnp.matmul(hn, p["router"].astype(hn.dtype))  # f32 (or f64) whatever compute_dtype
    probs, combine, chosen = route(mc, logits)
    hidden = L.swiglu(cfg, _emm(cfg, "nd,edf->enf", hn, p["w_gate"]), _emm(cfg, "nd,edf->enf", hn, p["w_up"]))
    ye = _emm(cfg, "enf,efd->end", hidden, p["w_down"])
    out = jnp.einsum("ne,end->nd", combine, ye)
    aux, z, load = moe_losses(mc, logits, probs, chosen)
    return out.reshape(*lead, D), aux, z, load


def moe_block_fwd(cfg: ModelConfig, mc: MoeConfig, p: Params, x: Array) -> tuple[Array, Array, Array, Array]:
    """x [B,T,D] f32 -> y, aux, z, load [E]: llama's attention, then the MoE MLP."""
    x = x + L.attention(cfg, p, L.norm(cfg, x, p["attn_norm"]))
    out, aux, z, load = moe_mlp(cfg, mc, p, L.norm(cfg, x, p["mlp_norm"]))
    return x + out, aux, z, load


def moe_objective(mc: MoeConfig, aux: Array, z: Array) -> Array:
    """What one MoE layer adds to the training loss."""
    return jnp.float32(mc.aux_weight) * aux + jnp.float32(mc.z_weight) * z


def moe_block_bwd(cfg: ModelConfig, mc: MoeConfig, p: Params, x: Array, dy: Array) -> tuple[Params, Array]:
    """Gradients of `sum(y·dy) + aux_weight·aux + z_weight·z`: the cotangents of
    the scalar outputs are the weights themselves (the total loss is the head's
    loss plus Σ_layers the objective), so the backward needs no extra input."""
    (_, aux, z, load), vjp = jax.vjp(lambda p_, x_: moe_block_fwd(cfg, mc, p_, x_), p, x)
    dp, dx = vjp((dy, jnp.asarray(mc.aux_weight, aux.dtype), jnp.asarray(mc.z_weight, z.dtype),
                  jnp.zeros_like(load)))
    return dp, dx


# --- the block kind (registry.py; blocks.py registers it) --------------------------

def _kind() -> BlockKind:
    def shape(cfg: ModelConfig, local: str) -> tuple[int, ...]:
        return moe_param_shape(cfg, MoeConfig.of(cfg), local)

    def init(cfg: ModelConfig, seed: Array, layer: Array, n_layers: Array) -> Params:
        return init_moe_block(cfg, MoeConfig.of(cfg), seed, layer, n_layers)

    def fwd_metrics(cfg: ModelConfig, p: Params, x: Array) -> tuple[Array, tuple[Array, ...]]:
        y, aux, z, load = moe_block_fwd(cfg, MoeConfig.of(cfg), p, x)
        return y, (aux, z, load)

    def fwd(cfg: ModelConfig, p: Params, x: Array) -> Array:
        return fwd_metrics(cfg, p, x)[0]

    def objective(cfg: ModelConfig, m: tuple[Array, ...]) -> Array:
        return moe_objective(MoeConfig.of(cfg), m[0], m[1])

    def metrics(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
        return [("aux_loss", ()), ("z_loss", ()), ("expert_load", (cfg.n_experts,))]

    def prefill(cfg: ModelConfig, p: Params, x: Array) -> tuple[Array, Array, Array]:
        _, k, v = llama._qkv(cfg, p, x)
        return fwd(cfg, p, x), k, v

    def decode(cfg: ModelConfig, p: Params, x: Array, k_cache: Array, v_cache: Array,
               pos: Array) -> tuple[Array, Array, Array]:
        a, k_cache, v_cache = llama.attention_decode(cfg, p, L.norm(cfg, x, p["attn_norm"]), k_cache, v_cache, pos)
        x = x + a
        out = moe_mlp(cfg, MoeConfig.of(cfg), p, L.norm(cfg, x, p["mlp_norm"]))[0]
        return x + out, k_cache, v_cache

    return BlockKind(
        name="moe", params=lambda cfg: MOE_PARAMS, init=init, fwd=fwd, shape=shape,
        validate=lambda cfg: MoeConfig.of(cfg) and None, metrics=metrics, fwd_metrics=fwd_metrics,
        objective=objective, prefill=prefill, decode=decode,
        doc="x += attn(rmsnorm(x)); x += top-k mixture of SwiGLU experts(rmsnorm(x))")


KIND = _kind()
