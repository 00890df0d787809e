"""Tensor-parallel block programs (docs/parallelism.md, "Tensor-parallel block programs").

Megatron-style split of one transformer block over the ``tensor`` mesh axis:

* the projections into heads and into the MLP hidden dimension are
  *column-parallel*: ``wq``, ``wk``, ``wv`` ([D, D]) and ``w_gate``, ``w_up``
  ([D, F]) are cut along dimension 1, so a device holds whole heads
  (``n_heads / tensor`` of them) and ``d_ff / tensor`` hidden units;
* the projections back to ``d_model`` are *row-parallel*: ``wo`` ([D, D]) and
  ``w_down`` ([F, D]) are cut along dimension 0;
* the two RMSNorm gains are replicated.

Each device computes its heads and its hidden units; the outputs of ``wo``
and ``w_down`` are partial sums over the tensor group and are all-reduced
there (Megatron's ``g``: psum forward, identity backward). In the backward
pass the gradient reaching each normalised input is partial too and is
all-reduced before the RMSNorm backward (Megatron's ``f``: identity forward,
psum backward), so the norm gains' gradients and ``dx`` come out whole on
every device of the group.

The all-reduces are explicit ``lax.psum`` inside a ``jax.shard_map`` body,
not left to XLA's partitioner: the program is then exactly the Megatron
program (two all-reduces in the forward, two more in the backward, where
the forward's are recomputed only as far as the backward needs them), the
per-device computation is the one-device model code on fewer heads, and no
partitioner choice (such as gathering a weight instead) can change what
each device holds or how much it sends. The programs are exported in the
convention of parallel.py: every input and output is a stack of per-device
blocks along dimension 0 (``P(("data", "fsdp", "tensor"))``), rank-0
scalars are replicated (``P()``), so the C side only ever sees local
buffers; the manifest entry records each tensor's logical ``sharding`` in
the form of ``st_sharding`` (include/strata/mesh.h): ``split[d]`` lists the
mesh axes dimension d is cut over, ``partial`` the axes the value is an
unreduced sum over; an axis in neither is replicated.

Activations are cut over the batch along ``data`` and ``fsdp`` (dimension 0)
and replicated over ``tensor``. The parameters a block program takes are
whole along ``data`` and ``fsdp`` (gathered, under fsdp) and cut over
``tensor``; its parameter gradients are partial over ``data`` and ``fsdp``
(each device's share of the batch) and cut over ``tensor`` like the
parameters.

``python -m strata_jax.tensor_parallel OUTDIR`` writes the test programs
(every program on tensor=2, tensor=4 and fsdp=2 x tensor=2) with
``tp_manifest.json``; run it with
``XLA_FLAGS=--xla_force_host_platform_device_count=4``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import layers as L
from . import llama
from . import model as M
from . import optimizers as O
from . import programs as PR
from .config import ModelConfig
from .mesh import MESH_AXES, MeshSpec, ParallelError, make_mesh
from .optim import adamw_update, sqnorm

Array = jax.Array
TENSOR = "tensor"
BATCH_AXES: tuple[str, ...] = ("data", "fsdp")

# Dimension of each block parameter cut over `tensor` (None: replicated).
PARAM_SPLIT_DIM: dict[str, int | None] = {
    "attn_norm": None, "wq": 1, "wk": 1, "wv": 1, "wo": 0,
    "mlp_norm": None, "w_gate": 1, "w_up": 1, "w_down": 0,
}
# Dimension of each residual (llama.RESIDUALS) cut over `tensor`: the
# per-head tensors along their head dimension, the MLP hidden activations
# along the hidden dimension; x_mid (the residual stream) is replicated.
RESIDUAL_SPLIT_DIM: dict[str, int | None] = {
    "q": 2, "k": 2, "v": 2, "attn_out": 2, "attn_lse": 1, "x_mid": None, "gate": 2, "up": 2,
}
_DTYPES = {"f32": jnp.float32, "s32": jnp.int32}


# --- Megatron's f and g --------------------------------------------------------

@jax.custom_vjp
def copy_to_tp(x: Array) -> Array:
    """Megatron's f: identity forward, all-reduce of the gradient over `tensor`."""
    return x


def _copy_fwd(x: Array) -> tuple[Array, None]:
    return x, None


def _copy_bwd(_: None, g: Array) -> tuple[Array]:
    return (lax.psum(g, TENSOR),)


copy_to_tp.defvjp(_copy_fwd, _copy_bwd)


@jax.custom_vjp
def reduce_from_tp(x: Array) -> Array:
    """Megatron's g: all-reduce over `tensor` forward, identity backward."""
    return lax.psum(x, TENSOR)


def _reduce_fwd(x: Array) -> tuple[Array, None]:
    return lax.psum(x, TENSOR), None


def _reduce_bwd(_: None, g: Array) -> tuple[Array]:
    return (g,)


reduce_from_tp.defvjp(_reduce_fwd, _reduce_bwd)


# --- the block on one device's heads and hidden units ----------------------------
#
# llama.py's block_fwd_res and block_bwd_res, with f and g at their places:
# the same functions as the one-device programs', on fewer heads.

MEGATRON = llama.Collectives(copy_in=copy_to_tp, reduce_out=reduce_from_tp)


def block_fwd_local(cfg: ModelConfig, p: dict[str, Array], x: Array) -> Array:
    """The block's forward on this device's part; y is whole (all-reduced)."""
    return llama.block_fwd_res(cfg, p, x, MEGATRON)[0]


# --- SPMD programs and their manifest entries -----------------------------------

@dataclass(frozen=True)
class ShardedSpec:
    """One input or output: its logical (whole) shape and how it lies on the mesh."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str
    split: tuple[tuple[str, ...], ...]  # per dimension: the mesh axes it is cut over
    partial: tuple[str, ...] = ()

    def local_shape(self, mesh: MeshSpec) -> tuple[int, ...]:
        out = []
        for d, axes in zip(self.shape, self.split):
            k = math.prod(mesh.size(a) for a in axes)
            if d % k:
                raise ParallelError(f"{self.name}: dimension of {d} cannot be cut {k} ways "
                                    f"over {'x'.join(axes)} (mesh {mesh.to_json()})")
            out.append(d // k)
        return tuple(out)

    def sharding_json(self) -> dict[str, Any]:
        return {"split": [list(a) for a in self.split], "partial": list(self.partial)}


def _spec(name: str, shape: Sequence[int], role: str, split: dict[int, tuple[str, ...]] | None = None,
          partial: tuple[str, ...] = (), dtype: str = "f32") -> ShardedSpec:
    split = split or {}
    return ShardedSpec(name, tuple(shape), dtype, role, tuple(tuple(split.get(d, ())) for d in range(len(shape))),
                       partial)


@dataclass(frozen=True)
class SpmdProgram:
    name: str
    mesh: MeshSpec
    body: Callable[..., tuple[Array, ...]]  # local blocks in -> local blocks out (shard_map body)
    inputs: tuple[ShardedSpec, ...]
    outputs: tuple[ShardedSpec, ...]
    donated: tuple[int, ...] = field(default=())

    def _pspec(self, s: ShardedSpec) -> P:
        return P() if not s.shape else P(MESH_AXES)

    def _global_shape(self, s: ShardedSpec) -> tuple[int, ...]:
        loc = s.local_shape(self.mesh)
        return () if not loc else (self.mesh.devices * loc[0],) + loc[1:]

    def jitted(self, mesh: Mesh) -> Any:
        ins = tuple(self._pspec(s) for s in self.inputs)
        outs = tuple(self._pspec(s) for s in self.outputs)
        f = jax.shard_map(self.body, mesh=mesh, in_specs=ins, out_specs=outs, check_vma=False)
        return jax.jit(f, in_shardings=tuple(NamedSharding(mesh, p) for p in ins),
                       out_shardings=tuple(NamedSharding(mesh, p) for p in outs),
                       donate_argnums=self.donated, keep_unused=True)

    def global_structs(self) -> list[jax.ShapeDtypeStruct]:
        return [jax.ShapeDtypeStruct(self._global_shape(s), _DTYPES[s.dtype]) for s in self.inputs]

    def lower(self, mesh: Mesh) -> str:
        text = self.jitted(mesh).lower(*self.global_structs()).as_text()
        if self.mesh.devices > 1 and f"mhlo.num_partitions = {self.mesh.devices} : i32" not in text:
            raise ParallelError(f"{self.name}: lowered text lacks mhlo.num_partitions = {self.mesh.devices}")
        return text

    def run(self, mesh: Mesh, per_device: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """per_device[p][i]: input i's block on mesh index p (a rank-0 input is
        taken from mesh index 0); returns out[p][i]."""
        D = self.mesh.devices
        args = [np.asarray(per_device[0][i]) if not s.shape else
                np.concatenate([per_device[p][i] for p in range(D)], axis=0)
                for i, s in enumerate(self.inputs)]
        outs = _cached_jit(self, mesh)(*args)
        res: list[list[np.ndarray]] = [[] for _ in range(D)]
        for o, s in zip(outs, self.outputs):
            blocks = [np.asarray(o)] * D if not s.shape else np.split(np.asarray(o), D, axis=0)
            for p in range(D):
                res[p].append(blocks[p])
        return res

    def manifest_entry(self, file: str | None = None) -> dict[str, Any]:
        def side(specs: tuple[ShardedSpec, ...]) -> list[dict[str, Any]]:
            out = []
            for s in specs:
                loc = s.local_shape(self.mesh)
                out.append({"name": s.name, "shape": list(s.shape), "local_shape": list(loc), "dtype": s.dtype,
                            "role": s.role, "sharding": s.sharding_json(),
                            "layout": {"global_shape": list(self._global_shape(s)),
                                       "spec": [] if not loc else [list(MESH_AXES)] + [[] for _ in loc[1:]]}})
            return out

        e: dict[str, Any] = {"name": self.name, "mesh": self.mesh.to_json(), "num_partitions": self.mesh.devices,
                             "num_replicas": 1, "tensor_groups": self.mesh.groups(TENSOR),
                             "inputs": side(self.inputs), "outputs": side(self.outputs),
                             "donated": list(self.donated)}
        if file is not None:
            e["file"] = file
        return e


@functools.lru_cache(maxsize=256)
def _cached_jit(prog: SpmdProgram, mesh: Mesh) -> Any:
    """One jit per (program, mesh): run() is called once per layer and step
    in tests that train with these programs."""
    return prog.jitted(mesh)


def _block_param_specs(cfg: ModelConfig, role: str = "param", prefix: str = "",
                       partial: tuple[str, ...] = ()) -> list[ShardedSpec]:
    out = []
    for n in M.BLOCK_PARAMS:
        d = PARAM_SPLIT_DIM[n]
        out.append(_spec(prefix + n, M.param_shape(cfg, n), role, {} if d is None else {d: (TENSOR,)},
                         partial))
    return out


def unsupported_kind(cfg: ModelConfig, tensor: int) -> str | None:
    """Why |cfg|'s stack cannot run over parallel.tensor = |tensor|, or None:
    only llama has tensor-parallel programs. A config error (exit 2)."""
    other = sorted(set(cfg.layer_kinds()) - {"llama"})
    if tensor > 1 and other:
        return (f"model.block/model.layers: block kind {other[0]!r} has no tensor-parallel programs "
                f"(parallel.tensor = {tensor}); only llama has")
    return None


def _check_mesh(cfg: ModelConfig, mesh: MeshSpec) -> None:
    t = mesh.tensor
    if cfg.n_heads % t or cfg.d_ff % t:
        raise ParallelError(f"model.n_heads ({cfg.n_heads}) and model.d_ff ({cfg.d_ff}) must be divisible by "
                            f"parallel.tensor ({t}): tensor parallelism splits the heads and the MLP hidden dimension")
    if cfg.kv_heads % t:
        raise ParallelError(f"model.n_kv_heads ({cfg.kv_heads}) must be divisible by parallel.tensor ({t}): "
                            f"tensor parallelism splits the key/value heads")
    kind_error = unsupported_kind(cfg, t)
    if kind_error:
        raise ParallelError(kind_error)
    b = mesh.data * mesh.fsdp
    if cfg.microbatch_size % b:
        raise ParallelError(f"microbatch_size {cfg.microbatch_size} is not divisible by data x fsdp = {b}")


def block_programs(cfg: ModelConfig, mesh: MeshSpec) -> list[SpmdProgram]:
    """tp_block_fwd, tp_block_bwd, tp_block_fwd_res, tp_block_bwd_res on |mesh|
    (same inputs and outputs, in the same order, as the one-device programs)."""
    _check_mesh(cfg, mesh)
    blk = M.BLOCK_PARAMS
    nb, nr = len(blk), len(llama.RESIDUALS)
    mb, T, D = cfg.microbatch_size, cfg.seq_len, cfg.d_model
    batch = {0: BATCH_AXES}
    x = _spec("x", (mb, T, D), "activation", batch)
    y = _spec("y", (mb, T, D), "activation", batch)
    dy = _spec("dy", (mb, T, D), "activation_grad", batch)
    dx = _spec("dx", (mb, T, D), "activation_grad", batch)
    params = _block_param_specs(cfg)
    grads = _block_param_specs(cfg, "grad", "grad_", partial=BATCH_AXES)
    res = []
    for r in PR.residual_specs(cfg):
        d = RESIDUAL_SPLIT_DIM[r.name]
        res.append(_spec(r.name, r.shape, "residual", {0: BATCH_AXES, **({} if d is None else {d: (TENSOR,)})}))

    # Under packing "pack" each program takes positions right after x (cut
    # over the batch like x) and traces its body inside layers.packed.
    pos = [_spec("positions", (mb, T), "batch", batch, dtype="s32")] if cfg.packed else []
    npos = len(pos)

    def at(a: tuple[Array, ...]) -> Any:
        return L.packed(a[nb + 1] if npos else None)

    def fwd(*a: Array) -> tuple[Array, ...]:
        with at(a):
            return (block_fwd_local(cfg, dict(zip(blk, a[:nb])), a[nb]),)

    def bwd(*a: Array) -> tuple[Array, ...]:
        p, xin, g = dict(zip(blk, a[:nb])), a[nb], a[nb + 1 + npos]
        with at(a):
            _, vjp = jax.vjp(lambda p_, x_: block_fwd_local(cfg, p_, x_), p, xin)
            dp, dxin = vjp(g)
        return tuple(dp[n] for n in blk) + (dxin,)

    def fwd_res(*a: Array) -> tuple[Array, ...]:
        with at(a):
            yv, r = llama.block_fwd_res(cfg, dict(zip(blk, a[:nb])), a[nb], MEGATRON)
        return (yv,) + r

    def bwd_res(*a: Array) -> tuple[Array, ...]:
        p, xin = dict(zip(blk, a[:nb])), a[nb]
        r, g = tuple(a[nb + 1 + npos:nb + 1 + npos + nr]), a[nb + 1 + npos + nr]
        with at(a):
            dp, dxin = llama.block_bwd_res(cfg, p, xin, r, g, MEGATRON)
        return tuple(dp[n] for n in blk) + (dxin,)

    return [
        SpmdProgram("tp_block_fwd", mesh, fwd, tuple(params + [x] + pos), (y,)),
        SpmdProgram("tp_block_bwd", mesh, bwd, tuple(params + [x] + pos + [dy]), tuple(grads + [dx])),
        SpmdProgram("tp_block_fwd_res", mesh, fwd_res, tuple(params + [x] + pos), tuple([y] + res)),
        SpmdProgram("tp_block_bwd_res", mesh, bwd_res, tuple(params + [x] + pos + res + [dy]), tuple(grads + [dx])),
    ]


def optimizer_programs(cfg: ModelConfig, mesh: MeshSpec) -> list[SpmdProgram]:
    """tp_sqnorm_block and tp_adamw_block on the block's tensor-cut tensors,
    whole along data and fsdp (after the data all-reduce). Refused with
    fsdp > 1: there the optimizer runs on fsdp shards of the tensor blocks,
    which this module does not export."""
    if mesh.fsdp > 1:
        raise ParallelError("the optimizer programs of tensor-cut parameters under fsdp > 1 are not exported yet "
                            "(docs/parallelism.md)")
    blk = M.BLOCK_PARAMS
    n = len(blk)
    split = [PARAM_SPLIT_DIM[k] is not None for k in blk]
    decay = [len(M.param_shape(cfg, k)) >= 2 for k in blk]
    params = _block_param_specs(cfg)
    grads = _block_param_specs(cfg, "grad", "grad_")
    m = _block_param_specs(cfg, "opt_m", "m_")
    v = _block_param_specs(cfg, "opt_v", "v_")
    scalars = [_spec("step", (), "scalar"), _spec("lr", (), "scalar"), _spec("gscale", (), "scalar")]
    hyper = _spec("hyper", (4,), "scalar")  # stacked like any rank-1 input: each device gets the 4 values

    def sqn(*g: Array) -> tuple[Array, ...]:
        # The cut gradients' squares are summed over the tensor group; the
        # replicated ones (norm gains) are counted once.
        cut = lax.psum(sqnorm([a for a, s in zip(g, split) if s]), TENSOR)
        return (cut + sqnorm([a for a, s in zip(g, split) if not s]),)

    def adamw(*a: Array) -> tuple[Array, ...]:
        # Elementwise: each device updates its own block, no communication.
        p, g, mi, vi = a[:n], a[n:2 * n], a[2 * n:3 * n], a[3 * n:4 * n]
        step, lr, gscale, hyp = a[4 * n:]
        new_p, new_m, new_v = adamw_update(p, g, mi, vi, decay, step, lr, gscale, hyp)
        return tuple(new_p) + tuple(new_m) + tuple(new_v)

    sq = SpmdProgram("tp_sqnorm_block", mesh, sqn, tuple(grads), (_spec("sqnorm", (), "metric"),))
    if cfg.optimizer is not None:
        return [sq, _tp_update_block(cfg, mesh, params, grads, scalars + [hyper], decay)]
    return [
        sq,
        SpmdProgram("tp_adamw_block", mesh, adamw, tuple(params + grads + m + v + scalars + [hyper]),
                    tuple(params + m + v), tuple(range(n)) + tuple(range(2 * n, 4 * n))),
    ]


def _tp_update_block(cfg: ModelConfig, mesh: MeshSpec, params: list[ShardedSpec], grads: list[ShardedSpec],
                     scalars: list[ShardedSpec], decay: list[bool]) -> SpmdProgram:
    """tp_update_block (the model JSON's optimizer object): the block's
    update (optimizers.py) on its tensor-cut tensors. Elementwise
    optimizers update their blocks alone, each state cut as its parameter;
    the others (adafactor, muon) get whole_update_program."""
    blk = M.BLOCK_PARAMS
    n = len(blk)
    opts = O.assignment(cfg)["block"]
    if not O.elementwise(opts):
        return whole_update_program(cfg, "block", mesh, "tp_update_block", lambda name: PARAM_SPLIT_DIM[name])
    layout = O.state_layout([M.param_shape(cfg, k) for k in blk], opts, O.constants(cfg.optimizer))
    states = [dataclasses.replace(params[s.index], name=f"{s.kind}_{blk[s.index]}", role=f"opt_{s.kind}")
              for s in layout]
    ns = len(states)
    c = O.constants(cfg.optimizer)

    def update(*a: Array) -> tuple[Array, ...]:
        p, g, st = a[:n], a[n:2 * n], a[2 * n:2 * n + ns]
        step, lr, gscale, hyp = a[2 * n + ns:]
        new_p, new_s = O.group_update(opts, layout, p, g, st, decay, step, lr, gscale, hyp, c)
        return tuple(new_p) + tuple(new_s)

    return SpmdProgram("tp_update_block", mesh, update, tuple(params + grads + states + scalars),
                       tuple(params + states), tuple(range(n)) + tuple(range(2 * n, 2 * n + ns)))


def whole_update_program(cfg: ModelConfig, group: str, mesh: MeshSpec, name: str,
                         split_dim: Callable[[str], int | None]) -> SpmdProgram:
    """A group's update for optimizers that need each parameter whole
    (adafactor's row and column statistics, muon's Newton-Schulz), on the
    blocks the plan keeps: each parameter cut over `tensor` along
    split_dim(name) (None: whole), then, with fsdp > 1, its dim 0 in
    ceil(d0 / fsdp) zero-padded rows per device (programs.shard_shape).

    Inside, every parameter, gradient and parameter-shaped state is
    all-gathered to the whole tensor (the fsdp padding dropped), the
    one-device update (optimizers.group_update) runs on the whole tensors
    on every device of the group, and each device keeps its own block of
    the results (padding rows zero again). A state of another shape
    (adafactor's factored moments) is kept whole on every device: every
    device computes the same value from the same whole gradient. The
    gathers cost what the forward's parameter all-gather costs, plus the
    gradients and states; the update's arithmetic is repeated fsdp x
    tensor times (docs/model.md, "Optimizers")."""
    names = M.group_param_names(cfg, group)
    n = len(names)
    shapes = [M.param_shape(cfg, p, group) for p in names]
    decay = [len(s) >= 2 for s in shapes]
    opts = O.assignment(cfg)[group]
    c = O.constants(cfg.optimizer)
    layout = O.state_layout(shapes, opts, c)
    F, T = mesh.fsdp, mesh.tensor
    dims = [split_dim(p) if T > 1 else None for p in names]

    def cut_shape(shape: tuple[int, ...], d: int | None) -> tuple[int, ...]:
        return shape if d is None else tuple(x // T if i == d else x for i, x in enumerate(shape))

    def spec(nm: str, shape: tuple[int, ...], d: int | None, role: str) -> ShardedSpec:
        # The logical shape of an fsdp-cut tensor is its padded one: F
        # blocks of ceil(d0 / F) rows (the tensor-cut block's d0 under tensor).
        loc = cut_shape(shape, d)
        split: dict[int, tuple[str, ...]] = {} if d is None else {d: (TENSOR,)}
        if F > 1 and shape:
            rows = PR.shard_shape(loc, F)[0] * F * (T if d == 0 else 1)
            shape = (rows,) + tuple(shape[1:])
            split[0] = split.get(0, ()) + ("fsdp",)  # a tensor block's rows, then its fsdp blocks
        return _spec(nm, shape, role, split)

    params = [spec(p, s, d, "param") for p, s, d in zip(names, shapes, dims)]
    grads = [spec("grad_" + p, s, d, "grad") for p, s, d in zip(names, shapes, dims)]
    whole_state = [slot.shape != shapes[slot.index] for slot in layout]
    states = [_spec(f"{sl.kind}_{names[sl.index]}", sl.shape, f"opt_{sl.kind}") if w else
              spec(f"{sl.kind}_{names[sl.index]}", shapes[sl.index], dims[sl.index], f"opt_{sl.kind}")
              for sl, w in zip(layout, whole_state)]
    ns = len(states)
    scalars = [_spec("step", (), "scalar"), _spec("lr", (), "scalar"), _spec("gscale", (), "scalar"),
               _spec("hyper", (4,), "scalar")]

    def gather(x: Array, i: int) -> Array:
        if F > 1 and x.ndim:
            x = lax.all_gather(x, "fsdp", axis=0, tiled=True)[:cut_shape(shapes[i], dims[i])[0]]
        if dims[i] is not None:
            x = lax.all_gather(x, TENSOR, axis=dims[i], tiled=True)
        return x

    def keep(x: Array, i: int) -> Array:
        d = dims[i]
        if d is not None:
            k = x.shape[d] // T
            x = lax.dynamic_slice_in_dim(x, lax.axis_index(TENSOR) * k, k, axis=d)
        if F > 1 and x.ndim:
            r = PR.shard_shape(x.shape, F)[0]
            x = jnp.pad(x, [(0, r * F - x.shape[0])] + [(0, 0)] * (x.ndim - 1))
            x = lax.dynamic_slice_in_dim(x, lax.axis_index("fsdp") * r, r, axis=0)
        return x

    def update(*a: Array) -> tuple[Array, ...]:
        p = [gather(x, i) for i, x in enumerate(a[:n])]
        g = [gather(x, i) for i, x in enumerate(a[n:2 * n])]
        st = [x if w else gather(x, sl.index) for x, sl, w in zip(a[2 * n:2 * n + ns], layout, whole_state)]
        step, lr, gscale, hyp = a[2 * n + ns:]
        new_p, new_s = O.group_update(opts, layout, p, g, st, decay, step, lr, gscale, hyp, c)
        return (tuple(keep(x, i) for i, x in enumerate(new_p))
                + tuple(x if w else keep(x, sl.index) for x, sl, w in zip(new_s, layout, whole_state)))

    return SpmdProgram(name, mesh, update, tuple(params + grads + states + scalars), tuple(params + states),
                       tuple(range(n)) + tuple(range(2 * n, 2 * n + ns)))


def whole_update_programs(cfg: ModelConfig, mesh: MeshSpec, split_dim: Callable[[str, str], int | None]) -> list[SpmdProgram]:
    """The fsdp shard programs' updates (update_<group>_fsdp<F>[_tp<T>]) of
    the groups whose optimizers need whole tensors (whole_update_program),
    as SPMD programs; none for elementwise ones (programs.fsdp_programs has
    their one-device block updates) or without fsdp (tensor alone:
    optimizer_programs' tp_update_block)."""
    if mesh.fsdp == 1 or cfg.optimizer is None:
        return []
    tail = f"_fsdp{mesh.fsdp}" + (f"_tp{mesh.tensor}" if mesh.tensor > 1 else "")
    return [whole_update_program(cfg, g, mesh, f"update_{g}{tail}", functools.partial(split_dim, g))
            for g in PR.groups_of(cfg) if not O.elementwise(O.assignment(cfg)[g])]


def tp_programs(cfg: ModelConfig, mesh: MeshSpec) -> list[SpmdProgram]:
    """What a bundle exported for |mesh| (tensor > 1) carries."""
    if mesh.tensor < 2:
        raise ParallelError("tensor-parallel programs need parallel.tensor >= 2")
    progs = block_programs(cfg, mesh)
    if mesh.fsdp == 1:
        progs += optimizer_programs(cfg, mesh)
    return progs


# --- splitting a logical value into per-device blocks and back --------------------

def _coords(mesh: MeshSpec, p: int) -> dict[str, int]:
    return dict(zip(MESH_AXES, (int(c) for c in np.unravel_index(p, mesh.shape))))


def _slices(spec: ShardedSpec, mesh: MeshSpec, c: dict[str, int]) -> tuple[slice, ...]:
    loc = spec.local_shape(mesh)
    out = []
    for d, axes in enumerate(spec.split):
        idx = 0
        for a in axes:  # row-major over the dimension's axes, as st_sharding
            idx = idx * mesh.size(a) + c[a]
        out.append(slice(idx * loc[d], (idx + 1) * loc[d]))
    return tuple(out)


def shard(value: np.ndarray, spec: ShardedSpec, mesh: MeshSpec) -> list[np.ndarray]:
    """The block each mesh index holds of |value| (a partial value on
    coordinate 0 of its partial axes, zeros elsewhere, as st_sharded_from_host)."""
    out = []
    for p in range(mesh.devices):
        c = _coords(mesh, p)
        b = np.array(value[_slices(spec, mesh, c)])
        if any(c[a] for a in spec.partial):
            b = np.zeros_like(b)
        out.append(b)
    return out


def unshard(blocks: Sequence[np.ndarray], spec: ShardedSpec, mesh: MeshSpec) -> np.ndarray:
    """The logical value of per-device |blocks|: cut dimensions concatenated,
    partial blocks summed, replicated axes read at coordinate 0."""
    out = np.zeros(spec.shape, np.asarray(blocks[0]).dtype)
    for p in range(mesh.devices):
        c = _coords(mesh, p)
        if any(c[a] for a in MESH_AXES if a not in spec.partial and not any(a in ax for ax in spec.split)):
            continue
        out[_slices(spec, mesh, c)] += blocks[p]
    return out


# --- test programs -------------------------------------------------------------

TEST_MESHES: tuple[tuple[str, MeshSpec], ...] = (
    ("t2", MeshSpec(tensor=2)), ("t4", MeshSpec(tensor=4)), ("f2t2", MeshSpec(fsdp=2, tensor=2)),
    ("d2t2", MeshSpec(data=2, tensor=2)),
)


def export_programs(cfg: ModelConfig, mesh: MeshSpec, outdir: str, prefix: str = "") -> list[dict[str, Any]]:
    """Writes tp_programs(cfg, mesh) as OUTDIR/<prefix><name>.mlir; returns their manifest entries."""
    jmesh = make_mesh(mesh)
    entries = []
    for prog in tp_programs(cfg, mesh):
        fname = f"{prefix}{prog.name}.mlir"
        with open(os.path.join(outdir, fname), "w", encoding="utf-8") as f:
            f.write(prog.lower(jmesh))
        entries.append(prog.manifest_entry(fname))
    return entries


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: XLA_FLAGS=--xla_force_host_platform_device_count=4 "
              "python -m strata_jax.tensor_parallel OUTDIR [MODEL_JSON]", file=sys.stderr)
        return 2
    jax.config.update("jax_platforms", "cpu")
    model = {"vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "seq_len": 16,
             "tie_embeddings": True, "compute_dtype": "f32", "rope_theta": 10000.0, "init_std": 0.02,
             "microbatch_size": 2}
    cfg = ModelConfig.from_json(argv[1]) if len(argv) == 2 else ModelConfig.from_dict(model)
    os.makedirs(argv[0], exist_ok=True)
    entries = []
    try:
        for tag, mesh in TEST_MESHES:
            entries += export_programs(cfg, mesh, argv[0], prefix=f"{tag}_")
    except ParallelError as e:
        print(f"strata_jax.tensor_parallel: {e}", file=sys.stderr)
        return 1
    with open(os.path.join(argv[0], "tp_manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"mesh_axes": list(MESH_AXES), "model": cfg.to_dict(), "programs": entries}, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
