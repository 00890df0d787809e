"""The registry of block kinds (docs/model.md, "Block kinds").

A block kind is everything the bundle needs to serve one kind of layer: its
parameters (names, shapes, init), its forward (which is also the reference:
`model.model_loss` runs it), and the programs built from them. The config
chooses a kind for every layer (`model.block`, or `model.layers`, one kind
per layer); the exporter gives each distinct kind its own parameter group
and program set and lists, per layer, which ones serve it (the layer
table). The C side reads that table and never names a block program.

Registering a kind: build a `BlockKind` and call `register(kind)` from a
module this file imports at its end. Only `name`, `params`, `init` and `fwd`
are required:

- without `fwd_res`/`bwd_res`, the residual-keeping programs keep nothing
  (`<prefix>_fwd_res` returns y alone, `<prefix>_bwd_res` recomputes the
  forward from x, like `<prefix>_bwd`): correct, with the cost of a
  recomputation under every `sched.remat` policy;
- without `prefill`/`decode` the bundle has no generation programs for the
  kind, and `strata sample` refuses a model that uses it (exit 4).

Parameter names are local to the kind (the table's full names are
`layers.<i>.<local>` whatever the kind); a kind whose parameters are not
among llama's (model.param_shape) gives their shapes with `shape`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp

from . import model as M
from .model import ModelConfig, Params

Array = jax.Array


@dataclass(frozen=True)
class BlockKind:
    name: str  # config value (model.block, model.layers entries)
    # Parameter names, in group order (they may depend on the config).
    params: Callable[[ModelConfig], tuple[str, ...]]
    # (cfg, seed s32[], layer s32[], n_layers s32[]) -> params. n_layers is an
    # input so that no program depends on the depth.
    init: Callable[[ModelConfig, Array, Array, Array], Params]
    # (cfg, params, x [B,T,D] f32) -> y [B,T,D] f32: the reference forward.
    fwd: Callable[[ModelConfig, Params, Array], Array]
    # Parameter group and program-name prefix: "<prefix>_fwd", "adamw_<group>".
    # Default: the kind's name.
    group: str = ""
    prefix: str = ""
    # Shape of a parameter; default model.param_shape.
    shape: Callable[[ModelConfig, str], tuple[int, ...]] | None = None
    # The residual-keeping pair (docs/bundle.md): (cfg, p, x) -> (y, residuals),
    # (cfg, p, x, residuals, dy) -> (grads dict, dx), and the residuals'
    # (name, shape, dtype) list: a residual may be kept in the compute dtype.
    fwd_res: Callable[..., tuple[Array, tuple[Array, ...]]] | None = None
    bwd_res: Callable[..., tuple[Params, Array]] | None = None
    residuals: Callable[[ModelConfig], list[tuple[str, tuple[int, ...], str]]] | None = None
    # Generation, batch 1: (cfg, p, x [1,T,D]) -> (y, k_cache, v_cache) and
    # (cfg, p, x [1,1,D], k_cache, v_cache, pos) -> (y, k_cache, v_cache);
    # caches [1, T, n_kv_heads, Dh].
    prefill: Callable[..., tuple[Array, Array, Array]] | None = None
    decode: Callable[..., tuple[Array, Array, Array]] | None = None
    # Checks of the config the kind needs beyond ModelConfig's (raise ValueError).
    validate: Callable[[ModelConfig], None] | None = None
    # Block metrics (docs/bundle.md, "Block metrics"): f32 scalars or vectors
    # the forward returns after y (an MoE layer's auxiliary losses and expert
    # loads), as (name, shape) in order; the forward that returns them,
    # (cfg, p, x) -> (y, metrics); and the layer's share of the training loss
    # from them, (cfg, metrics) -> f32 scalar. The kind's fwd/fwd_res programs
    # return them, its bwd/bwd_res include that share's gradient (the seed of
    # a scalar metric is its weight in the objective), and the C trainer
    # reports them (aux_loss, z_loss, expert_load_min/_max). A kind with
    # metrics keeps no residuals today (fwd_res must be None).
    metrics: Callable[[ModelConfig], list[tuple[str, tuple[int, ...]]]] | None = None
    fwd_metrics: Callable[[ModelConfig, Params, Array], tuple[Array, tuple[Array, ...]]] | None = None
    objective: Callable[[ModelConfig, tuple[Array, ...]], Array] | None = None
    # The family: which embedding and head the kind's layers go with
    # (docs/model.md, "Families"): "llama" (token embedding; RMSNorm head)
    # or "gpt2" (token plus learned position embedding; LayerNorm head with
    # a bias). Every layer of a stack must be of one family.
    family: str = "llama"
    # Parameters initialised to zeros (biases); the manifest's "init" says so.
    zeros: frozenset[str] = frozenset()
    # Matrices initialised with init_std / sqrt(2 n_layers) (the manifest's
    # "init"); default llama's (wo, w_down).
    residual_out: frozenset[str] | None = None
    doc: str = ""

    @property
    def group_name(self) -> str:
        return self.group or self.name

    @property
    def program_prefix(self) -> str:
        return self.prefix or self.name

    def param_shape(self, cfg: ModelConfig, local: str) -> tuple[int, ...]:
        return self.shape(cfg, local) if self.shape else M.param_shape(cfg, local)


KINDS: dict[str, BlockKind] = {}


def register(kind: BlockKind) -> BlockKind:
    if kind.name in KINDS:
        raise ValueError(f"block kind {kind.name!r} is registered twice")
    taken = {k.group_name for k in KINDS.values()} | {"embed", "head"}
    if kind.group_name in taken:
        raise ValueError(f"block kind {kind.name!r}: parameter group {kind.group_name!r} is taken")
    KINDS[kind.name] = kind
    return kind


def kinds_of(cfg: ModelConfig) -> list[BlockKind]:
    """The distinct kinds of the stack, in order of first use."""
    seen: list[str] = []
    for k in cfg.layer_kinds():
        if k not in seen:
            seen.append(k)
    return [KINDS[k] for k in seen]


def kind_of_group(group: str) -> BlockKind | None:
    return next((k for k in KINDS.values() if k.group_name == group), None)


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


# --- llama: RMSNorm, RoPE attention (grouped-query with n_kv_heads), SwiGLU -------

def _llama_residuals(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], str]]:
    from . import programs as PR
    return [(s.name, s.shape, s.dtype) for s in PR.residual_specs(cfg)]


def _llama() -> BlockKind:
    from . import programs as PR
    return BlockKind(
        name="llama", group="block", prefix="block",
        params=lambda cfg: M.BLOCK_PARAMS, init=M.init_block, fwd=M.block_fwd,
        fwd_res=PR.block_fwd_res, bwd_res=PR.block_bwd_res, residuals=_llama_residuals,
        prefill=PR.block_prefill, decode=PR.block_decode,
        doc="x += attn(rmsnorm(x)); x += swiglu(rmsnorm(x))")


# --- parallel: one norm, attention and MLP side by side (GPT-J, PaLM) --------------

PARALLEL_PARAMS: tuple[str, ...] = ("attn_norm", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def parallel_init(cfg: ModelConfig, seed: Array, layer: Array, n_layers: Array) -> Params:
    return init_matrices(cfg, KINDS["parallel"], seed, layer, n_layers, M.BLOCK_MATRICES, M.RESIDUAL_OUT)


def parallel_fwd(cfg: ModelConfig, p: Params, x: Array) -> Array:
    h = M.norm(cfg, x, p["attn_norm"])
    return x + M.attention(cfg, p, h) + M.mlp(cfg, p, h)


def parallel_prefill(cfg: ModelConfig, p: Params, x: Array) -> tuple[Array, Array, Array]:
    from . import programs as PR
    _, k, v = PR._qkv(cfg, p, x)
    return parallel_fwd(cfg, p, x), k, v


def parallel_decode(cfg: ModelConfig, p: Params, x: Array, k_cache: Array, v_cache: Array,
                    pos: Array) -> tuple[Array, Array, Array]:
    from . import programs as PR
    h = M.norm(cfg, x, p["attn_norm"])
    a, k_cache, v_cache = PR.attention_decode(cfg, p, h, k_cache, v_cache, pos)
    return x + a + M.mlp(cfg, p, h), k_cache, v_cache


def _parallel() -> BlockKind:
    return BlockKind(
        name="parallel", params=lambda cfg: PARALLEL_PARAMS, init=parallel_init, fwd=parallel_fwd,
        prefill=parallel_prefill, decode=parallel_decode,
        doc="h = rmsnorm(x); x += attn(h) + swiglu(h)")


register(_llama())
register(_parallel())

from . import moe  # noqa: E402,F401  (registers "moe")
from . import gpt2  # noqa: E402,F401  (registers "gpt2")
