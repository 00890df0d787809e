"""SPMD programs over a device mesh: the inter-layer collectives (docs/parallelism.md).

The mesh has three named axes, always in this order: ``data``, ``fsdp``,
``tensor`` (sizes default 1). A device's *mesh index* is its row-major
position over the axes (data slowest, tensor fastest); the C side maps mesh
index p to the runtime device it names in the compile options' device
assignment (partition p).

Every collective is its own program, exported as StableHLO with Shardy
(``sdy``) sharding annotations, ``mhlo.num_partitions`` = devices in the mesh,
``mhlo.num_replicas`` = 1. The C side compiles it with SPMD partitioning and
the Shardy partitioner on, and runs it with one argument list per device.

Physical layout in the exported text: every input and output is a *stack of
per-device blocks* along dimension 0, sharded over all mesh axes
(``P(("data", "fsdp", "tensor"))``). So the global shapes in the text are
``devices * local[0]`` rows, and each device's buffer is its own local block:
what a device holds is never assumed equal to another device's (gradients
before a reduction differ on every device). The logical meaning of each
block is recorded in the manifest entry (``logical``):

* ``partial``    (unreduced sum over ``axis``: the value is the sum of the blocks)
* ``sharded``    (dimension 0 split over ``axis``, padded to a multiple of its size)
* ``replicated`` (every device along ``axis`` holds the whole value)

Kinds (all sums; scaling, e.g. 1/devices for a mean, is the plan's business):

* ``all_gather``     sharded -> replicated   (FSDP: gather one layer's parameters)
* ``reduce_scatter`` partial -> sharded      (FSDP: reduce one layer's gradients)
* ``all_reduce``     partial -> replicated   (DP: reduce one layer's gradients)

Padding: a tensor whose dimension 0 (``d0``) is not a multiple of the axis
size ``n`` is sharded as ``ceil(d0 / n)`` rows per device; the last shards
carry zero rows. ``reduce_scatter`` pads before scattering; ``all_gather``
drops the padding after gathering.

``python -m strata_jax.parallel OUTDIR`` writes the collective test programs
(the C test tests/c/test_mesh.c reads ``OUTDIR/spmd_index.txt``); run it with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (N >= 4), since JAX
needs as many devices as the largest mesh when it lowers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import model as M
from .config import ModelConfig
from . import tensor_parallel as TP
from .mesh import MESH_AXES, MeshSpec, ParallelError, make_mesh, mesh_for_cli, parse_mesh  # noqa: F401
from .programs import groups_of

KINDS: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce")
_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "s32": jnp.int32}
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "s32": 4}


@dataclass(frozen=True)
class Tensor:
    """One tensor a collective moves. With |tensor_dim| set, |shape| is one
    device's block of a tensor cut over the ``tensor`` axis along that
    dimension (tensor_parallel.py): the collective runs within each tensor
    coordinate, on the blocks."""
    name: str
    shape: tuple[int, ...]
    dtype: str = "f32"
    tensor_dim: int | None = None

    def __post_init__(self) -> None:
        if len(self.shape) < 1 or any(d < 1 for d in self.shape):
            raise ParallelError(f"{self.name}: collectives need rank >= 1 and positive dims, got {self.shape}")
        if self.dtype not in _DTYPES:
            raise ParallelError(f"{self.name}: dtype {self.dtype!r} not supported")


def _rows(d0: int, n: int) -> int:
    """Rows per device when d0 rows are sharded over n devices (padded)."""
    return -(-d0 // n)


@dataclass(frozen=True)
class CollectiveProgram:
    name: str
    kind: str
    axis: str
    mesh: MeshSpec
    tensors: tuple[Tensor, ...]
    donate: bool = False  # all_reduce only: the inputs' buffers become the outputs

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ParallelError(f"{self.name}: unknown collective kind {self.kind!r}")
        if self.donate and self.kind != "all_reduce":
            raise ParallelError(f"{self.name}: only all_reduce keeps its shapes, so only it can donate its inputs")

    @property
    def n(self) -> int:
        return self.mesh.size(self.axis)

    def _sharded_shape(self, t: Tensor) -> tuple[int, ...]:
        return (_rows(t.shape[0], self.n),) + t.shape[1:]

    def local_inputs(self) -> list[tuple[int, ...]]:
        if self.kind == "all_gather":
            return [self._sharded_shape(t) for t in self.tensors]
        return [t.shape for t in self.tensors]

    def local_outputs(self) -> list[tuple[int, ...]]:
        if self.kind == "reduce_scatter":
            return [self._sharded_shape(t) for t in self.tensors]
        return [t.shape for t in self.tensors]

    def logical(self, side: str) -> dict[str, Any]:
        kind = {("all_gather", "in"): "sharded", ("all_gather", "out"): "replicated",
                ("reduce_scatter", "in"): "partial", ("reduce_scatter", "out"): "sharded",
                ("all_reduce", "in"): "partial", ("all_reduce", "out"): "replicated"}[(self.kind, side)]
        d = {"kind": kind, "axis": self.axis}
        if kind == "sharded":
            d["dim"] = 0
        return d

    def bytes_per_device(self) -> int:
        """The collective's message size per device (NCCL's "size"): the full
        (padded, for FSDP) tensors one device ends up with (all_gather) or
        starts from (reduce_scatter, all_reduce)."""
        total = 0
        for t in self.tensors:
            rows = _rows(t.shape[0], self.n) * self.n if self.kind != "all_reduce" else t.shape[0]
            total += rows * math.prod(t.shape[1:]) * _DTYPE_BYTES[t.dtype]
        return total

    def wire_bytes_per_device(self) -> int:
        """Bytes each device sends in a ring implementation: (n-1)/n of the
        message for all_gather and reduce_scatter, twice that for all_reduce."""
        n = self.n
        b = self.bytes_per_device() * (n - 1) // n
        return 2 * b if self.kind == "all_reduce" else b

    def body(self) -> Callable[..., tuple[Any, ...]]:
        axis, n, kind, tensors = self.axis, self.n, self.kind, self.tensors

        def fn(*xs: Any) -> tuple[Any, ...]:
            outs = []
            for t, x in zip(tensors, xs):
                if kind == "all_reduce":
                    outs.append(lax.psum(x, axis))
                elif kind == "reduce_scatter":
                    pad = _rows(t.shape[0], n) * n - t.shape[0]
                    if pad:
                        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
                    outs.append(lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True))
                else:
                    g = lax.all_gather(x, axis, axis=0, tiled=True)
                    outs.append(g[:t.shape[0]])
            return tuple(outs)

        return fn

    def jitted(self, mesh: Mesh) -> Any:
        stack = P(MESH_AXES)  # dimension 0 = the per-device blocks, in mesh order
        k = len(self.tensors)
        f = jax.shard_map(self.body(), mesh=mesh, in_specs=(stack,) * k, out_specs=(stack,) * k,
                          check_vma=False)
        sh = NamedSharding(mesh, stack)
        return jax.jit(f, in_shardings=(sh,) * k, out_shardings=(sh,) * k,
                       donate_argnums=tuple(range(k)) if self.donate else ())

    def global_structs(self, shapes: list[tuple[int, ...]]) -> list[jax.ShapeDtypeStruct]:
        D = self.mesh.devices
        return [jax.ShapeDtypeStruct((D * s[0],) + s[1:], _DTYPES[t.dtype]) for s, t in zip(shapes, self.tensors)]

    def lower(self, mesh: Mesh) -> str:
        text = self.jitted(mesh).lower(*self.global_structs(self.local_inputs())).as_text()
        if f"mhlo.num_partitions = {self.mesh.devices} : i32" not in text and self.mesh.devices > 1:
            raise ParallelError(f"{self.name}: lowered text lacks mhlo.num_partitions = {self.mesh.devices}")
        return text

    def run(self, mesh: Mesh, per_device: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """Runs the program in JAX: per_device[p][i] is input i on mesh index p;
        returns out[p][i]."""
        D = self.mesh.devices
        args = [np.concatenate([per_device[p][i] for p in range(D)], axis=0) for i in range(len(self.tensors))]
        outs = self.jitted(mesh)(*args)
        res: list[list[np.ndarray]] = [[] for _ in range(D)]
        for i, o in enumerate(outs):
            blocks = np.split(np.asarray(o), D, axis=0)
            for p in range(D):
                res[p].append(blocks[p])
        return res

    def manifest_entry(self, file: str | None = None) -> dict[str, Any]:
        def side(shapes: list[tuple[int, ...]], which: str) -> list[dict[str, Any]]:
            out = []
            for t, s in zip(self.tensors, shapes):
                d = {"name": t.name, "shape": list(t.shape), "local_shape": list(s), "dtype": t.dtype,
                     "logical": self.logical(which),
                     "layout": {"global_shape": [self.mesh.devices * s[0]] + list(s[1:]),
                                "spec": [list(MESH_AXES)] + [[] for _ in s[1:]]}}
                if t.tensor_dim is not None:  # "shape" is then the tensor-local block's
                    d["tensor_cut"] = {"axis": "tensor", "dim": t.tensor_dim}
                out.append(d)
            return out

        e = {"name": self.name, "kind": self.kind, "axis": self.axis, "axis_size": self.n,
             "donated": list(range(len(self.tensors))) if self.donate else [],
             "mesh": self.mesh.to_json(), "num_partitions": self.mesh.devices, "num_replicas": 1,
             "groups": self.mesh.groups(self.axis),
             "bytes_per_device": self.bytes_per_device(),
             "wire_bytes_per_device": self.wire_bytes_per_device(),
             "inputs": side(self.local_inputs(), "in"), "outputs": side(self.local_outputs(), "out")}
        if file is not None:
            e["file"] = file
        return e


def reference(prog: CollectiveProgram, per_device: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """The collective computed with numpy from its definition (for tests)."""
    D, n = prog.mesh.devices, prog.n
    out: list[list[np.ndarray]] = [[None] * len(prog.tensors) for _ in range(D)]  # type: ignore[list-item]
    for group in prog.mesh.groups(prog.axis):
        for i, t in enumerate(prog.tensors):
            xs = [np.asarray(per_device[p][i]) for p in group]
            if prog.kind == "all_gather":
                full = np.concatenate(xs, axis=0)[:t.shape[0]]
                for p in group:
                    out[p][i] = full
            else:
                s = np.sum(np.stack(xs), axis=0, dtype=xs[0].dtype)
                if prog.kind == "all_reduce":
                    for p in group:
                        out[p][i] = s
                else:
                    rows = _rows(t.shape[0], n)
                    s = np.concatenate([s, np.zeros((rows * n - t.shape[0],) + s.shape[1:], s.dtype)], axis=0)
                    for r, p in enumerate(group):
                        out[p][i] = s[r * rows:(r + 1) * rows]
    return out


def layer_collectives(tensors: Sequence[Tensor], mesh: MeshSpec, prefix: str = "block") -> list[CollectiveProgram]:
    """The inter-layer collectives of one layer's tensors on |mesh|: FSDP
    all-gather (parameters) and reduce-scatter (gradients) when fsdp > 1, DP
    all-reduce (gradients) when data > 1. With both (HSDP), the all-reduce
    over data runs on the fsdp shards the reduce-scatter leaves. With
    tensor > 1 each collective runs within each tensor coordinate, so
    tensors cut over ``tensor`` must be given as their blocks (tensor_dim)."""
    tensors = tuple(tensors)
    progs = []
    if mesh.fsdp > 1:
        progs.append(CollectiveProgram(f"{prefix}_fsdp_all_gather", "all_gather", "fsdp", mesh, tensors))
        progs.append(CollectiveProgram(f"{prefix}_fsdp_reduce_scatter", "reduce_scatter", "fsdp", mesh, tensors))
    if mesh.data > 1:
        shards = tuple(Tensor(t.name, (_rows(t.shape[0], mesh.fsdp),) + t.shape[1:], t.dtype, t.tensor_dim)
                       for t in tensors)
        progs.append(CollectiveProgram(f"{prefix}_data_all_reduce", "all_reduce", "data", mesh, shards))
    return progs


def block_tensors(cfg: ModelConfig, mesh: MeshSpec) -> list[Tensor]:
    """A transformer block's parameters (model.BLOCK_PARAMS) as one device
    holds them before any fsdp cut: with tensor > 1, the Megatron blocks of
    tensor_parallel.PARAM_SPLIT_DIM."""
    if mesh.tensor == 1:
        return [Tensor(n, M.param_shape(cfg, n)) for n in M.BLOCK_PARAMS]
    # Only the heads and d_ff matter here: the parameters do not depend on the batch.
    TP._check_mesh(dataclasses.replace(cfg, microbatch_size=cfg.microbatch_size * mesh.data * mesh.fsdp), mesh)
    out = []
    for n in M.BLOCK_PARAMS:
        shape, d = list(M.param_shape(cfg, n)), TP.PARAM_SPLIT_DIM[n]
        if d is not None:
            shape[d] //= mesh.tensor
        out.append(Tensor(n, tuple(shape), tensor_dim=d))
    return out


def model_layer_collectives(cfg: ModelConfig, mesh: MeshSpec) -> list[CollectiveProgram]:
    """layer_collectives for a transformer block's parameters (block_tensors)."""
    return layer_collectives(block_tensors(cfg, mesh), mesh)


def bundle_collectives(cfg: ModelConfig, mesh: MeshSpec) -> list[CollectiveProgram]:
    """The collectives of every parameter group (embed, block, head): what a
    bundle exported for |mesh| carries. One block program serves every layer,
    as block_fwd does.

    With tensor > 1 the block's collectives move its tensor-local blocks
    (block_tensors); embed and head are not cut over tensor and run
    replicated there, so theirs move whole tensors. On a tensor-only mesh
    there are none: the block's reductions are inside its tensor-parallel
    programs, and embed and head get the same inputs on every device.
    With all three axes above 1 the same programs compose: the fsdp
    collectives cut and rebuild the tensor blocks within each (data,
    tensor) coordinate, and the data all-reduce moves their fsdp shards
    within each (fsdp, tensor) coordinate."""
    progs = []
    for group in groups_of(cfg):
        if group == "block":
            tensors = block_tensors(cfg, mesh)
        else:  # embed, head, and block kinds other than llama (not cut over tensor: _check_mesh)
            tensors = [Tensor(n, M.param_shape(cfg, n, group)) for n in M.group_param_names(cfg, group)]
        progs += layer_collectives(tensors, mesh, prefix=group)
    return progs


# --- test programs for the C runtime ----------------------------------------

# (mesh, axis) pairs the C test runs; two tensors each, one whose dimension 0
# is not a multiple of 4 (padding) and one vector.
TEST_CASES: tuple[tuple[str, MeshSpec, str], ...] = (
    ("fsdp2", MeshSpec(fsdp=2), "fsdp"),
    ("fsdp4", MeshSpec(fsdp=4), "fsdp"),
    ("data2", MeshSpec(data=2), "data"),
    ("d2f2_fsdp", MeshSpec(data=2, fsdp=2), "fsdp"),
    ("d2f2_data", MeshSpec(data=2, fsdp=2), "data"),
    ("f2t2_fsdp", MeshSpec(fsdp=2, tensor=2), "fsdp"),  # a faster axis after the collective's
)
TEST_TENSORS: tuple[Tensor, ...] = (Tensor("w", (6, 3)), Tensor("b", (5,)))


def test_programs() -> list[CollectiveProgram]:
    progs = [CollectiveProgram(f"{case}_{kind}", kind, axis, mesh, TEST_TENSORS)
             for case, mesh, axis in TEST_CASES for kind in KINDS]
    progs.append(CollectiveProgram("data2_all_reduce_donated", "all_reduce", "data", MeshSpec(data=2), TEST_TENSORS,
                                   donate=True))
    return progs


def _dims(shape: Sequence[int]) -> str:
    return ",".join(str(d) for d in shape)


def export_test_programs(outdir: str) -> dict[str, Any]:
    """Writes each test program's MLIR, spmd_index.txt (for the C test) and
    spmd_manifest.json (the manifest entries). Returns the manifest."""
    os.makedirs(outdir, exist_ok=True)
    lines, entries = [], []
    for prog in test_programs():
        mesh = make_mesh(prog.mesh)
        fname = f"{prog.name}.mlir"
        with open(os.path.join(outdir, fname), "w", encoding="utf-8") as f:
            f.write(prog.lower(mesh))
        m = prog.mesh
        lines.append(f"program {prog.name} {fname} {prog.kind} {prog.axis} {m.data} {m.fsdp} {m.tensor}")
        for i, (t, s) in enumerate(zip(prog.tensors, prog.local_inputs())):
            lines.append(f"in {prog.name} {i} {t.dtype} {_dims(s)} {_dims(t.shape)}")
        for i, (t, s) in enumerate(zip(prog.tensors, prog.local_outputs())):
            lines.append(f"out {prog.name} {i} {t.dtype} {_dims(s)} {_dims(t.shape)}")
        entries.append(prog.manifest_entry(fname))
    with open(os.path.join(outdir, "spmd_index.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    manifest = {"mesh_axes": list(MESH_AXES), "collectives": entries}
    with open(os.path.join(outdir, "spmd_manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    return manifest


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m strata_jax.parallel OUTDIR",
              file=sys.stderr)
        return 2
    jax.config.update("jax_platforms", "cpu")
    try:
        export_test_programs(argv[0])
    except ParallelError as e:
        print(f"strata_jax.parallel: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
