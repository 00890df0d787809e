"""The bundle's programs (docs/bundle.md) as flat positional JAX functions.

`build_programs(cfg)` returns, for each program, the function and the exact
input/output tables of the contract. The exporter lowers them; tests and the
reference can call the very same functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp

from . import model as M
from .model import ModelConfig
from .optim import adamw_update, sqnorm

Array = jax.Array
GROUPS: tuple[str, ...] = ("embed", "block", "head")
_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "s32": jnp.int32, "u32": jnp.uint32}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "f32" | "bf16" | "s32" | "u32"
    role: str

    def struct(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.shape, _DTYPES[self.dtype])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "role": self.role}


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable[..., tuple[Array, ...]]  # positional inputs -> tuple of outputs
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    donated: tuple[int, ...] = field(default=())


def _scalar(name: str, dtype: str = "f32") -> TensorSpec:
    return TensorSpec(name, (), dtype, "scalar")


def _specs(cfg: ModelConfig, names: tuple[str, ...], role: str, prefix: str = "") -> list[TensorSpec]:
    return [TensorSpec(prefix + n, M.param_shape(cfg, n), "f32", role) for n in names]


def build_programs(cfg: ModelConfig) -> list[Program]:
    """Every program of the bundle, in manifest order. Independent of n_layers."""
    mb, T, D = cfg.microbatch_size, cfg.seq_len, cfg.d_model
    tied = cfg.tie_embeddings
    blk = M.BLOCK_PARAMS
    head = M.head_param_names(cfg)
    nb, nh = len(blk), len(head)

    seed = _scalar("seed", "s32")
    tokens = TensorSpec("tokens", (mb, T), "s32", "batch")
    targets = TensorSpec("targets", (mb, T), "s32", "batch")
    mask = TensorSpec("mask", (mb, T), "f32", "batch")
    x = TensorSpec("x", (mb, T, D), "f32", "activation")
    y = TensorSpec("y", (mb, T, D), "f32", "activation")
    dx = TensorSpec("dx", (mb, T, D), "f32", "activation_grad")
    dy = TensorSpec("dy", (mb, T, D), "f32", "activation_grad")
    loss = TensorSpec("loss", (), "f32", "loss")
    wte = _specs(cfg, ("wte",), "param")
    grad_wte = _specs(cfg, ("wte",), "grad", "grad_")

    def embed_init(s: Array) -> tuple[Array, ...]:
        return (M.init_embed(cfg, s)["wte"],)

    def block_init(s: Array, layer: Array) -> tuple[Array, ...]:
        p = M.init_block(cfg, s, layer)
        return tuple(p[n] for n in blk)

    def head_init(s: Array) -> tuple[Array, ...]:
        p = M.init_head(cfg, s)
        return tuple(p[n] for n in head)

    def embed_fwd(w: Array, tok: Array) -> tuple[Array, ...]:
        return (M.embed_fwd(cfg, w, tok),)

    def embed_bwd(w: Array, tok: Array, g: Array) -> tuple[Array, ...]:
        _, vjp = jax.vjp(lambda w_: M.embed_fwd(cfg, w_, tok), w)
        return vjp(g)

    def block_fwd(*args: Array) -> tuple[Array, ...]:
        return (M.block_fwd(cfg, dict(zip(blk, args[:nb])), args[nb]),)

    def block_bwd(*args: Array) -> tuple[Array, ...]:
        params, xin, g = dict(zip(blk, args[:nb])), args[nb], args[nb + 1]
        _, vjp = jax.vjp(lambda p, x_: M.block_fwd(cfg, p, x_), params, xin)
        dp, dxin = vjp(g)
        return tuple(dp[n] for n in blk) + (dxin,)

    def _head_args(args: tuple[Array, ...]) -> tuple[dict[str, Array], Array | None, Array, Array, Array]:
        params = dict(zip(head, args[:nh]))
        i = nh
        w = None
        if tied:
            w, i = args[i], i + 1
        return params, w, args[i], args[i + 1], args[i + 2]

    def head_loss(*args: Array) -> tuple[Array, ...]:
        params, w, xin, tgt, msk = _head_args(args)
        fn = lambda p, w_, x_: M.head_loss(cfg, p, w_, x_, tgt, msk)  # noqa: E731
        value, (dp, dw, dxin) = jax.value_and_grad(fn, argnums=(0, 1, 2))(params, w, xin)
        return (value,) + tuple(dp[n] for n in head) + ((dw,) if tied else ()) + (dxin,)

    def head_eval(*args: Array) -> tuple[Array, ...]:
        params, w, xin, tgt, msk = _head_args(args)
        return (M.head_loss(cfg, params, w, xin, tgt, msk),)

    head_in = _specs(cfg, head, "param") + (wte if tied else []) + [x, targets, mask]
    progs = [
        Program("embed_init", embed_init, [seed], wte),
        Program("block_init", block_init, [seed, _scalar("layer", "s32")], _specs(cfg, blk, "param")),
        Program("head_init", head_init, [seed], _specs(cfg, head, "param")),
        Program("embed_fwd", embed_fwd, wte + [tokens], [x]),
        Program("embed_bwd", embed_bwd, wte + [tokens, dx], grad_wte),
        Program("block_fwd", block_fwd, _specs(cfg, blk, "param") + [x], [y]),
        Program("block_bwd", block_bwd, _specs(cfg, blk, "param") + [x, dy],
                _specs(cfg, blk, "grad", "grad_") + [dx]),
        Program("head_loss", head_loss, head_in,
                [loss] + _specs(cfg, head, "grad", "grad_") + (grad_wte if tied else []) + [dx]),
        Program("head_eval", head_eval, head_in, [loss]),
    ]
    for g in GROUPS:
        progs += _group_programs(cfg, g)
    return progs


def _group_programs(cfg: ModelConfig, group: str) -> list[Program]:
    names = M.group_param_names(cfg, group)
    n = len(names)
    decay = [len(M.param_shape(cfg, p)) >= 2 for p in names]

    def accum(*args: Array) -> tuple[Array, ...]:
        return tuple(a + b for a, b in zip(args[:n], args[n:], strict=True))

    def sqn(*args: Array) -> tuple[Array, ...]:
        return (sqnorm(args),)

    def adamw(*args: Array) -> tuple[Array, ...]:
        p, g, m, v = args[:n], args[n:2 * n], args[2 * n:3 * n], args[3 * n:4 * n]
        step, lr, gscale, hyper = args[4 * n:]
        new_p, new_m, new_v = adamw_update(p, g, m, v, decay, step, lr, gscale, hyper)
        return tuple(new_p) + tuple(new_m) + tuple(new_v)

    params = _specs(cfg, names, "param")
    grads = _specs(cfg, names, "grad", "grad_")
    m = _specs(cfg, names, "opt_m", "m_")
    v = _specs(cfg, names, "opt_v", "v_")
    scalars = [_scalar("step"), _scalar("lr"), _scalar("gscale"),
               TensorSpec("hyper", (4,), "f32", "scalar")]
    return [
        Program(f"accum_{group}", accum, _specs(cfg, names, "grad", "a_") + _specs(cfg, names, "grad", "b_"),
                grads, tuple(range(n))),
        Program(f"sqnorm_{group}", sqn, grads, [TensorSpec("sqnorm", (), "f32", "metric")]),
        Program(f"adamw_{group}", adamw, params + grads + m + v + scalars, params + m + v,
                tuple(range(n)) + tuple(range(2 * n, 4 * n))),
    ]


def programs_by_name(cfg: ModelConfig) -> dict[str, Program]:
    return {p.name: p for p in build_programs(cfg)}
