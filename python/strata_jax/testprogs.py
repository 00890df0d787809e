"""Test programs for strata's runtime, exported with the pinned JAX.

``python -m strata_jax.testprogs OUTDIR`` writes, for each program, its
StableHLO (MLIR text, or portable bytecode for the ``*_bc`` ones), fixed
inputs and JAX's own outputs as raw little-endian files, and an index the C
tests parse, ``OUTDIR/index.txt``, one record per line::

    program NAME FILE text|bytecode
    in  NAME INDEX DTYPE DIMS FILE
    out NAME INDEX DTYPE DIMS FILE

DTYPE uses strata's names (f32, bf16, s32, u32, pred); DIMS is ``4,8`` or
``-`` for a scalar. Files are relative to OUTDIR. Everything is
deterministic: the same jax version writes the same bytes.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

_DTYPE_NAMES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.int32): "s32",
    np.dtype(np.uint32): "u32",
    np.dtype(np.bool_): "pred",
}


def _dtype_name(dt) -> str:
    dt = np.dtype(dt)
    if dt == jnp.bfloat16:
        return "bf16"
    return _DTYPE_NAMES[dt]


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# --- the programs -----------------------------------------------------------


def elementwise(x, y):
    """Broadcasting: f32[4,8] with f32[8] and a scalar."""
    return jnp.tanh(x * y + 1.0) - 0.5 * y


def matmul(x, w):
    return x @ w


def reduction(x):
    return jnp.sum(x, axis=1) + jnp.max(x, axis=1)


def multi_out(x, y):
    return x + y, x * y, jnp.sum(x - y)


def donate(state, delta):
    return state + 0.5 * delta


def while_loop(x, n):
    def body(carry):
        i, v = carry
        return i + 1, v * 0.5 + jnp.float32(1.0)

    def cond(carry):
        return carry[0] < n

    i, v = lax.while_loop(cond, body, (jnp.int32(0), x))
    return v, i


def bf16(a, b):
    return (a @ b) + a[:, :4]


def ints(a, b, s):
    return a * b + 3, a > b, s * jnp.uint32(2) + jnp.uint32(1)


def bigreduce(x, w):
    """Large reductions (for the determinism test): a long sum and a dot
    with a long contraction dimension."""
    return jnp.sum(x), jnp.sum(x * x, axis=0), x[:256, :] @ w


def _programs():
    r = _rng(1234)
    f32 = np.float32
    progs = []

    def add(name, fn, args, donate_argnums=(), bytecode=False):
        progs.append((name, fn, args, donate_argnums, bytecode))

    add("elementwise", elementwise, [r.standard_normal((4, 8)).astype(f32), r.standard_normal(8).astype(f32)])
    add("matmul", matmul, [r.standard_normal((4, 8)).astype(f32), r.standard_normal((8, 4)).astype(f32)])
    add("reduction", reduction, [r.standard_normal((16, 32)).astype(f32)])
    add("multi_out", multi_out, [r.standard_normal((3, 5)).astype(f32), r.standard_normal((3, 5)).astype(f32)])
    add("donate", donate, [r.standard_normal((4, 8)).astype(f32), r.standard_normal((4, 8)).astype(f32)],
        donate_argnums=(0,))
    add("while_loop", while_loop, [r.standard_normal(8).astype(f32), np.int32(10)])
    add("bf16", bf16, [r.standard_normal((4, 8)).astype(jnp.bfloat16), r.standard_normal((8, 4)).astype(jnp.bfloat16)])
    add("ints", ints, [r.integers(-100, 100, 16).astype(np.int32), r.integers(-100, 100, 16).astype(np.int32),
                       np.uint32(7)])
    add("elementwise_bc", elementwise, [r.standard_normal((4, 8)).astype(f32), r.standard_normal(8).astype(f32)],
        bytecode=True)
    add("bigreduce", bigreduce, [r.standard_normal((1024, 4096)).astype(f32),
                                 r.standard_normal((4096, 256)).astype(f32)])
    return progs


# --- writing ----------------------------------------------------------------


def _dims(a) -> str:
    return ",".join(str(d) for d in a.shape) if a.ndim else "-"


def _write_array(path: str, a) -> None:
    a = np.asarray(a)
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    # Raw little-endian, row-major (numpy's default layout on x86/arm).
    with open(path, "wb") as f:
        f.write(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes())


def export_all(outdir: str) -> list[str]:
    os.makedirs(outdir, exist_ok=True)
    lines = []
    for name, fn, args, donate_argnums, bytecode in _programs():
        jitted = jax.jit(fn, donate_argnums=donate_argnums)
        specs = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args]
        if bytecode:
            exported = jax.export.export(jitted)(*specs)
            code = exported.mlir_module_serialized
            fname = f"{name}.mlirbc"
            with open(os.path.join(outdir, fname), "wb") as f:
                f.write(code)
            kind = "bytecode"
        else:
            text = jitted.lower(*specs).as_text()
            fname = f"{name}.mlir"
            with open(os.path.join(outdir, fname), "w") as f:
                f.write(text)
            kind = "text"
        lines.append(f"program {name} {fname} {kind}")
        # JAX's own result, computed without donation so inputs stay valid.
        outs = jax.jit(fn)(*[jnp.asarray(a) for a in args])
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        for i, a in enumerate(args):
            a = np.asarray(a)
            f = f"{name}.in{i}.bin"
            _write_array(os.path.join(outdir, f), a)
            lines.append(f"in {name} {i} {_dtype_name(a.dtype)} {_dims(a)} {f}")
        for i, o in enumerate(outs):
            o = np.asarray(o)
            f = f"{name}.out{i}.bin"
            _write_array(os.path.join(outdir, f), o)
            lines.append(f"out {name} {i} {_dtype_name(o.dtype)} {_dims(o)} {f}")
    with open(os.path.join(outdir, "index.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m strata_jax.testprogs OUTDIR", file=sys.stderr)
        return 2
    jax.config.update("jax_platforms", "cpu")
    export_all(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
