"""The registry of block kinds (docs/model.md, "Block kinds").

A block kind is everything the bundle needs to serve one kind of layer: its
parameters (names, shapes, init), its forward (which is also the reference:
`model.model_loss` runs it), and the programs built from them. The config
chooses a kind for every layer (`model.block`, or `model.layers`, one kind
per layer); the exporter gives each distinct kind its own parameter group
and program set and lists, per layer, which ones serve it (the layer
table). The C side reads that table and never names a block program.

model.py and programs.py know kinds only through this registry. A kind is
registered with `register(kind)`; the built-in kinds are registered in one
place, blocks.py, which model.py imports. Only `name`, `params`, `init` and
`fwd` are required:

- without `fwd_res`/`bwd_res`, the residual-keeping programs keep nothing
  (`<prefix>_fwd_res` returns y alone, `<prefix>_bwd_res` recomputes the
  forward from x, like `<prefix>_bwd`): correct, with the cost of a
  recomputation under every `sched.remat` policy;
- without `prefill`/`decode` the bundle has no generation programs for the
  kind, and `strata sample` refuses a model that uses it (exit 4).

Parameter names are local to the kind (the table's full names are
`layers.<i>.<local>` whatever the kind); a kind whose parameters are not
among llama's (layers.param_shape) gives their shapes with `shape`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax

from . import config
from . import kernels as K
from . import layers as L
from .config import ModelConfig
from .layers import Params

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
        return self.shape(cfg, local) if self.shape else L.param_shape(cfg, local)


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


def family(cfg: ModelConfig) -> str:
    """The embedding and head the stack's kinds go with (BlockKind.family):
    "llama" (token embedding; RMSNorm, then the output projection) or
    "gpt2" (token plus learned position embedding; LayerNorm with bias)."""
    return KINDS[cfg.layer_kinds()[0]].family


def check_config(cfg: ModelConfig) -> None:
    """The checks of a ModelConfig that need what config.py does not import:
    the registered kinds (known names, one family a stack, each kind's own
    checks) and the kernel contract (kernels.check_selection)."""
    for key, kinds in (("model.block", [cfg.block]), ("model.layers", list(cfg.layers))):
        for kind in kinds:
            if kind not in KINDS:
                raise ValueError(f"{key}: unknown block kind {kind!r} (registered: "
                                 f"{', '.join(sorted(KINDS))}; docs/model.md, \"Block kinds\")")
    K.check_selection(dict(cfg.kernels))
    families = {k: KINDS[k].family for k in dict.fromkeys(cfg.layer_kinds())}
    if len(set(families.values())) > 1:
        raise ValueError(f"model.layers: block kinds of different families cannot share a stack "
                         f"({', '.join(f'{k}: {f}' for k, f in families.items())}): the family decides the "
                         f"embedding and the head (docs/model.md, \"Families\")")
    for kind in dict.fromkeys(cfg.layer_kinds()):
        check = KINDS[kind].validate
        if check is not None:
            check(cfg)


config.add_check(check_config)
