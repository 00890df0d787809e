"""A device mesh: its named axes and sizes (docs/parallelism.md).

The mesh has three named axes, always in this order: ``data``, ``fsdp``,
``tensor`` (sizes default 1). A device's *mesh index* is its row-major
position over the axes (data slowest, tensor fastest). The collectives
over a mesh are parallel.py's, the tensor-parallel block programs
tensor_parallel.py's; both build on this module.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

import jax
from jax.sharding import Mesh

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor")


class ParallelError(ValueError):
    pass


@dataclass(frozen=True)
class MeshSpec:
    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self) -> None:
        for a in MESH_AXES:
            v = getattr(self, a)
            if not isinstance(v, int) or v < 1:
                raise ParallelError(f"mesh axis {a} must be an integer >= 1, got {v!r}")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, a) for a in MESH_AXES)

    @property
    def devices(self) -> int:
        return math.prod(self.shape)

    def size(self, axis: str) -> int:
        if axis not in MESH_AXES:
            raise ParallelError(f"unknown mesh axis {axis!r} (axes: {', '.join(MESH_AXES)})")
        return getattr(self, axis)

    def to_json(self) -> dict[str, int]:
        return {a: getattr(self, a) for a in MESH_AXES}

    def groups(self, axis: str) -> list[list[int]]:
        """The mesh indices that communicate along |axis|, one list per group."""
        idx = np.arange(self.devices).reshape(self.shape)
        k = MESH_AXES.index(axis)
        moved = np.moveaxis(idx, k, -1).reshape(-1, self.size(axis))
        return [list(map(int, g)) for g in moved]


def make_mesh(spec: MeshSpec, devices: Sequence[Any] | None = None) -> Mesh:
    devs = list(devices) if devices is not None else jax.devices()
    if len(devs) < spec.devices:
        raise ParallelError(
            f"mesh {spec.to_json()} needs {spec.devices} devices, JAX has {len(devs)} "
            f"(set XLA_FLAGS=--xla_force_host_platform_device_count={spec.devices} before importing jax)")
    return Mesh(np.array(devs[:spec.devices], dtype=object).reshape(spec.shape), MESH_AXES)


def mesh_for_cli(text: str, set_cpu_devices: bool) -> MeshSpec:
    """A command line's --mesh: parse_mesh, and with |set_cpu_devices| JAX's
    CPU device count set to the mesh's (XLA_FLAGS is read when the backend
    starts, which is after this) unless XLA_FLAGS already names one."""
    mesh = parse_mesh(text)
    flags = os.environ.get("XLA_FLAGS", "")
    if set_cpu_devices and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={mesh.devices}").strip()
    return mesh


def parse_mesh(text: str) -> MeshSpec:
    """'data=2,fsdp=2' (axes left out are 1) -> MeshSpec."""
    sizes: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        if not eq or name not in MESH_AXES or name in sizes:
            raise ParallelError(f"mesh {text!r}: expected axis=size items with axes {', '.join(MESH_AXES)}, each once")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise ParallelError(f"mesh {text!r}: {name} size {value!r} is not an integer") from None
    return MeshSpec(**sizes)
