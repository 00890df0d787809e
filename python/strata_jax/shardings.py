"""The monolithic step over a device mesh, MaxText's way (docs/parallelism.md).

The shardings of reference_train.make_train_step's jit when it runs over a
mesh: the reference (reference_train.train) and the bench anchors
(anchor.py) use them.
"""

from __future__ import annotations

from typing import Any

from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


# --- the same step over a device mesh (MaxText's way) --------------------------
#
# One jax.jit over the mesh's devices: the batch is cut over data x fsdp, the
# parameters (and so m and v, which have their shardings) over fsdp along
# their d_model dimension, and over tensor along the heads / MLP hidden /
# vocabulary dimension, as MaxText's logical axis rules do ("embed" -> fsdp,
# "heads"/"mlp"/"vocab" -> tensor). XLA's partitioner inserts every
# collective; the math is the one-device step's, only reduction orders differ.

# Mesh axis of each dimension of each parameter (None: not cut).
PARAM_AXES: dict[str, tuple[str | None, ...]] = {
    "wte": ("tensor", "fsdp"), "attn_norm": ("fsdp",), "mlp_norm": ("fsdp",), "final_norm": ("fsdp",),
    "wq": ("fsdp", "tensor"), "wk": ("fsdp", "tensor"), "wv": ("fsdp", "tensor"), "wo": ("tensor", "fsdp"),
    "w_gate": ("fsdp", "tensor"), "w_up": ("fsdp", "tensor"), "w_down": ("tensor", "fsdp"),
    "w_out": ("fsdp", "tensor"),
}


def param_pspec(name: str, shape: tuple[int, ...], mesh: Any, stacked: bool = False) -> Any:
    """PartitionSpec of one parameter; a dimension an axis does not divide is
    left whole (no padding in the anchor). |stacked|: a leading layer axis."""
    dims = shape[1:] if stacked else shape
    axes = []
    for d, a in zip(dims, PARAM_AXES[name]):
        axes.append(a if a is not None and mesh.shape[a] > 1 and d % mesh.shape[a] == 0 else None)
    return P(*(([None] if stacked else []) + axes))


def mesh_shardings(params: Any, mesh: Any) -> tuple[Any, Any, Any]:
    """(parameter shardings (a tree like |params|), batch sharding, replicated)
    for the unrolled (blocks: list) or scanned (blocks: stacked dict) layout."""
    def tree(group: Any, stacked: bool) -> Any:
        return {k: NamedSharding(mesh, param_pspec(k, tuple(a.shape), mesh, stacked)) for k, a in group.items()}

    blocks = params["blocks"]
    ps = {"embed": tree(params["embed"], False), "head": tree(params["head"], False),
          "blocks": tree(blocks, True) if isinstance(blocks, dict) else [tree(b, False) for b in blocks]}
    # tokens/targets/mask/positions are [microbatches, microbatch, seq]: cut the microbatch
    return ps, NamedSharding(mesh, P(None, ("data", "fsdp"))), NamedSharding(mesh, P())


def step_shardings(params: Any, mesh: Any, n_batch: int = 3) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The step's (in, out) shardings; |n_batch| batch arrays (tokens, targets,
    mask, and positions under packing none or pack: 4)."""
    ps, bs, rep = mesh_shardings(params, mesh)
    return (ps, ps, ps) + (bs,) * n_batch + (rep, rep, rep, rep), (ps, ps, ps, rep, rep)
