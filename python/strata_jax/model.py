"""The whole decoder-only model: its parameter table, init, embedding, head
and loss, over the registered block kinds (docs/model.md).

The layers' maths is layers.py's (re-exported here: model.block_fwd,
model.attention, ...), the configuration config.py's (model.ModelConfig);
each layer runs its kind's functions, found in the registry (registry.py).
Importing this module registers the built-in kinds (blocks.py).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from . import blocks  # noqa: F401  (registers the built-in block kinds)
from . import kernels as K
from . import layers as L
from . import registry as R
from .config import ModelConfig
from .layers import (  # noqa: F401  (the layers' names, as model.<name>)
    BLOCK_MATRICES, BLOCK_PARAMS, LN_EPS, NORM_EPS, RESIDUAL_OUT, Array, Params, apply_rope, attention, block_fwd,
    cdot, embed_fwd, expand_kv, init_block, layer_norm, mask_padding, masked_ce, mlp, norm, packed, rms_norm,
    rope_tables, swiglu, weighted_ce,
)


# --- parameter structure -------------------------------------------------------

def head_param_names(cfg: ModelConfig) -> tuple[str, ...]:
    norm = ("final_norm", "final_norm_bias") if R.family(cfg) == "gpt2" else ("final_norm",)
    return norm if cfg.tie_embeddings else norm + ("w_out",)


def embed_param_names(cfg: ModelConfig) -> tuple[str, ...]:
    """wte first (the tied head reads it), then the gpt2 family's positions."""
    return ("wte", "wpe") if R.family(cfg) == "gpt2" else ("wte",)


def group_param_names(cfg: ModelConfig, group: str) -> tuple[str, ...]:
    if group == "embed":
        return embed_param_names(cfg)
    if group == "head":
        return head_param_names(cfg)
    kind = R.kind_of_group(group)
    if kind is None:
        raise ValueError(f"unknown group {group!r}")
    return kind.params(cfg)


def param_shape(cfg: ModelConfig, local: str, group: str | None = None) -> tuple[int, ...]:
    """Shape of parameter |local|; |group| names a block kind's group whose
    parameters are not llama's (registry.BlockKind.shape)."""
    if group not in (None, "embed", "head", "block"):
        kind = R.kind_of_group(group)
        if kind is not None and kind.shape is not None:
            return kind.shape(cfg, local)
    return L.param_shape(cfg, local)


def param_init_std(cfg: ModelConfig, local: str, group: str | None = None) -> float | None:
    """Std of the normal init, or None for norms (initialised to ones) and biases (zeros)."""
    if len(param_shape(cfg, local, group)) < 2:
        return None
    resid_out = RESIDUAL_OUT
    if group not in (None, "embed", "head"):
        kind = R.kind_of_group(group)
        if kind is not None and kind.residual_out is not None:
            resid_out = kind.residual_out
    if local in resid_out:
        return cfg.init_std / math.sqrt(2.0 * cfg.n_layers)
    return cfg.init_std


def param_init_text(cfg: ModelConfig, local: str, group: str | None = None) -> str:
    """The manifest's "init" of a parameter: "normal(std)", "ones" or "zeros"."""
    std = param_init_std(cfg, local, group)
    if std is not None:
        return f"normal({std!r})"
    zeros: frozenset[str] = frozenset({"final_norm_bias"})
    if group not in (None, "embed", "head"):
        kind = R.kind_of_group(group)
        zeros = kind.zeros if kind is not None else frozenset()
    return "zeros" if local in zeros else "ones"


# --- init ----------------------------------------------------------------------

def init_embed(cfg: ModelConfig, seed: Array) -> Params:
    """wte: normal rows for the vocabulary, zeros for the padding rows (no
    token embeds them; masked out of the tied head's logits); the gpt2
    family's wpe: normal, its own key (fold_in(root, 3))."""
    key = jax.random.fold_in(jax.random.PRNGKey(seed), 0)
    wte = L.normal(key, (cfg.vocab_size, cfg.d_model), cfg.init_std)
    if cfg.vocab_rows > cfg.vocab_size:
        wte = jnp.concatenate([wte, jnp.zeros((cfg.vocab_rows - cfg.vocab_size, cfg.d_model), jnp.float32)])
    out = {"wte": wte}
    if R.family(cfg) == "gpt2":
        out["wpe"] = L.normal(jax.random.fold_in(jax.random.PRNGKey(seed), 3), L.param_shape(cfg, "wpe"), cfg.init_std)
    return out


def init_head(cfg: ModelConfig, seed: Array) -> Params:
    out: Params = {"final_norm": jnp.ones(L.param_shape(cfg, "final_norm"), jnp.float32)}
    if R.family(cfg) == "gpt2":
        out["final_norm_bias"] = jnp.zeros(L.param_shape(cfg, "final_norm_bias"), jnp.float32)
    if not cfg.tie_embeddings:
        key = jax.random.fold_in(jax.random.PRNGKey(seed), 2)
        w_out = L.normal(key, (cfg.d_model, cfg.vocab_size), cfg.init_std)
        if cfg.vocab_rows > cfg.vocab_size:
            w_out = jnp.concatenate([w_out, jnp.zeros((cfg.d_model, cfg.vocab_rows - cfg.vocab_size), jnp.float32)], 1)
        out["w_out"] = w_out
    return out


# --- embedding and head ----------------------------------------------------------

def embed(cfg: ModelConfig, p: Params, tokens: Array, pos: Array | int = 0,
          positions: Array | None = None) -> Array:
    """The embedding group's forward: wte[tokens], plus for the gpt2 family
    the learned positions wpe[pos .. pos + S - 1] of tokens [B, S], or with
    |positions| ([B, S] s32, packing "pack") wpe[positions]."""
    x = L.embed_fwd(cfg, p["wte"], tokens)
    if R.family(cfg) == "gpt2":
        if positions is not None:
            return x + jnp.take(p["wpe"], positions, axis=0)
        x = x + jax.lax.dynamic_slice_in_dim(p["wpe"], pos, tokens.shape[-1], 0)[None]
    return x


def final_norm(cfg: ModelConfig, p: Params, x: Array) -> Array:
    if R.family(cfg) == "gpt2":
        return layer_norm(x, p["final_norm"], p["final_norm_bias"])
    return norm(cfg, x, p["final_norm"])


def head_logits(cfg: ModelConfig, p: Params, wte: Array | None, x: Array) -> Array:
    """Logits over vocab_rows ids (padding ids not masked: head_loss does that)."""
    h = final_norm(cfg, p, x)
    w_out = wte.T if cfg.tie_embeddings else p["w_out"]
    assert w_out is not None
    return L._mm(cfg, h, w_out)


def head_loss(cfg: ModelConfig, p: Params, wte: Array | None, x: Array,
              targets: Array, mask: Array) -> Array:
    """packing concat: the masked mean sum(ce * mask) / sum(mask); none and
    pack: sum(ce * mask) / (mb * T), the constant size of |mask| (the trainer
    scales by (mb * T) / W, W the global batch's sum of weights)."""
    logits = mask_padding(cfg, head_logits(cfg, p, wte, x))
    impl = cfg.kernel("cross_entropy")
    if impl == "xla":
        return weighted_ce(logits, targets, mask) if cfg.weighted_loss else masked_ce(logits, targets, mask)
    # kernels.cross_entropy (docs/kernels.md): the per-row loss through the
    # kernel on [B*T, V]; the padding ids' -1e30 above and the masked mean
    # below stay jnp.
    V = logits.shape[-1]
    ce = K.call("cross_entropy", impl, logits.astype(jnp.float32).reshape(-1, V), targets.astype(jnp.int32).reshape(-1))
    mask = mask.astype(jnp.float32)
    if cfg.weighted_loss:
        return jnp.sum(ce.reshape(mask.shape) * mask) / jnp.float32(mask.size)
    return jnp.sum(ce.reshape(mask.shape) * mask) / jnp.sum(mask)


# --- the whole model (reference, tests) ---------------------------------------

FullParams = dict[str, Any]  # {"embed": Params, "blocks": list[Params], "head": Params}


@functools.lru_cache(maxsize=16)
def _jitted_inits(cfg: ModelConfig) -> tuple[Any, dict[str, Any], Any]:
    kinds = {k: jax.jit(functools.partial(R.KINDS[k].init, cfg)) for k in set(cfg.layer_kinds())}
    return (jax.jit(functools.partial(init_embed, cfg)), kinds, jax.jit(functools.partial(init_head, cfg)))


def init_params(cfg: ModelConfig, seed: int) -> FullParams:
    """Same values as the embed_init/<kind>_init/head_init programs."""
    emb, blk, head = _jitted_inits(cfg)
    s = jnp.int32(seed)
    depth = jnp.int32(cfg.n_layers)
    return {"embed": emb(s), "blocks": [blk[k](s, jnp.int32(i), depth) for i, k in enumerate(cfg.layer_kinds())],
            "head": head(s)}


def _pack_positions(cfg: ModelConfig, positions: Array | None) -> Array | None:
    """The positions the forward uses: |positions| under packing "pack", else
    None (concat and none: 0..T-1 in every sequence, today's programs)."""
    return positions if cfg.packed else None


def _stack(cfg: ModelConfig, params: FullParams, tokens: Array, positions: Array | None) -> Array:
    """Embedding and every layer's kind's reference forward: the last layer's output."""
    pos = _pack_positions(cfg, positions)
    with packed(pos):
        x = embed(cfg, params["embed"], tokens, positions=pos)
        for kind, p in zip(cfg.layer_kinds(), params["blocks"], strict=True):
            x = R.KINDS[kind].fwd(cfg, p, x)
    return x


def model_loss(cfg: ModelConfig, params: FullParams, tokens: Array, targets: Array,
               mask: Array, positions: Array | None = None) -> Array:
    """The whole model's loss: each layer's kind's reference forward.
    |positions| ([B, T] s32) are used under packing "pack" only."""
    wte = params["embed"]["wte"]
    x = _stack(cfg, params, tokens, positions)
    return head_loss(cfg, params["head"], wte if cfg.tie_embeddings else None, x, targets, mask)


def model_logits(cfg: ModelConfig, params: FullParams, tokens: Array, positions: Array | None = None) -> Array:
    """The whole model's logits [B, T, vocab_rows] (padding ids masked), f32:
    for tests (a packed document's logits do not see the others')."""
    wte = params["embed"]["wte"]
    x = _stack(cfg, params, tokens, positions)
    return mask_padding(cfg, head_logits(cfg, params["head"], wte if cfg.tie_embeddings else None, x))


def model_objective(cfg: ModelConfig, params: FullParams, tokens: Array, targets: Array,
                    mask: Array, positions: Array | None = None) -> tuple[Array, tuple[Array, dict[str, list[Array]]]]:
    """What training differentiates: the head's loss plus, for every layer
    whose kind has metrics (registry.BlockKind.metrics: an MoE layer's
    auxiliary losses), its kind's objective of them. Returns (objective,
    (loss, {metric name: [value per such layer]})). |positions|: as model_loss."""
    pos = _pack_positions(cfg, positions)
    with packed(pos):
        return _objective(cfg, params, tokens, targets, mask, pos)


def _objective(cfg: ModelConfig, params: FullParams, tokens: Array, targets: Array, mask: Array,
               pos: Array | None) -> tuple[Array, tuple[Array, dict[str, list[Array]]]]:
    wte = params["embed"]["wte"]
    x = embed(cfg, params["embed"], tokens, positions=pos)
    extra: Array | None = None  # stays None (nothing added) for a stack without metrics
    metrics: dict[str, list[Array]] = {}
    for kind_name, p in zip(cfg.layer_kinds(), params["blocks"], strict=True):
        kind = R.KINDS[kind_name]
        if kind.fwd_metrics is None:
            x = kind.fwd(cfg, p, x)
            continue
        x, mets = kind.fwd_metrics(cfg, p, x)
        assert kind.objective is not None and kind.metrics is not None
        share = kind.objective(cfg, mets)
        extra = share if extra is None else extra + share
        for (name, _), v in zip(kind.metrics(cfg), mets, strict=True):
            metrics.setdefault(name, []).append(v)
    loss = head_loss(cfg, params["head"], wte if cfg.tie_embeddings else None, x, targets, mask)
    return (loss if extra is None else loss + extra), (loss, metrics)


def flat_param_names(cfg: ModelConfig) -> list[str]:
    """Names of the manifest's parameter table, in table order."""
    names = list(embed_param_names(cfg))
    for i, kind in enumerate(cfg.layer_kinds()):
        names += [f"layers.{i}.{n}" for n in R.KINDS[kind].params(cfg)]
    return names + list(head_param_names(cfg))


def flatten_params(params: FullParams) -> dict[str, Array]:
    out: dict[str, Array] = dict(params["embed"])
    for i, p in enumerate(params["blocks"]):
        out.update({f"layers.{i}.{k}": v for k, v in p.items()})
    out.update(params["head"])
    return out
