"""Kernels: each hot op of a block in three implementations, one contract.

The contract is ``kernel_contract.json`` beside this file; strata compiles the
same file into its C side (src/kernels/contract.c), so the op names, versions,
FFI target names and tolerances cannot drift between the two. docs/kernels.md.

Implementations, chosen per op by config ``kernels.<op>`` (the model JSON's
``kernels`` object, left out when every op is at ``xla``):

- ``xla``: plain ``jnp``, the reference. XLA fuses it with its neighbours.
- ``ffi``: a custom call to strata's C kernel (``jax.ffi.ffi_call``); forward
  and backward are separate targets joined by ``jax.custom_vjp``. strata
  registers the handlers with the PJRT plugin before any compile; JAX itself
  cannot run these programs (its own CPU client has no such handlers), which
  is why they are verified through strata (``strata kernels verify``).
- ``pallas``: a Pallas kernel. On CPU it runs in interpret mode only
  (``interpret=True``: Pallas lowers the kernel body to plain StableHLO
  loops), for verification; it is not fast there.

A call whose operands fall outside the contract (another dtype) takes the
contract's fallback (``xla``) and is recorded (``fallbacks_seen``) so the
exporter can say so in the manifest: never a silent wrong result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp

Array = jax.Array

CONTRACT: dict[str, Any] = json.loads(Path(__file__).with_name("kernel_contract.json").read_text(encoding="utf-8"))
OPS: dict[str, dict[str, Any]] = {op["name"]: op for op in CONTRACT["ops"]}
IMPLS = ("xla", "ffi", "pallas")
NORM_EPS = 1e-6  # rmsnorm v1 fixes it (model.NORM_EPS)

# (op, asked, used, why) for every call that fell back, in trace order.
fallbacks_seen: list[tuple[str, str, str, str]] = []


def check_selection(kernels: dict[str, str]) -> None:
    """Raises ValueError naming the key for an unknown op or implementation."""
    for op, impl in kernels.items():
        if op not in OPS:
            raise ValueError(f"kernels.{op}: no such kernel op (the contract has: {', '.join(sorted(OPS))})")
        if impl not in OPS[op]["implementations"]:
            raise ValueError(f"kernels.{op}={impl!r}: not an implementation of {op} "
                             f"({'|'.join(OPS[op]['implementations'])})")


_DTYPE_NAMES = {"float32": "f32", "bfloat16": "bf16", "int32": "s32"}


def _in_contract(op: str, *arrays: Array) -> str | None:
    """None when the operands fit the contract's dtypes, else why not."""
    for spec, a in zip(OPS[op]["inputs"], arrays):
        name = jnp.dtype(a.dtype).name
        if _DTYPE_NAMES.get(name, name) not in spec["dtypes"]:
            return f"{spec['name']} is {a.dtype}, the contract allows {'|'.join(spec['dtypes'])}"
    return None


# --- rmsnorm ----------------------------------------------------------------


def rmsnorm_xla(x: Array, gain: Array) -> Array:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + NORM_EPS) * gain


def _ffi(target: str, results: Any, *args: Array) -> Any:
    return jax.ffi.ffi_call(target, results)(*args)


@jax.custom_vjp
def rmsnorm_ffi(x: Array, gain: Array) -> Array:
    return _ffi(OPS["rmsnorm"]["ffi_targets"]["fwd"], jax.ShapeDtypeStruct(x.shape, jnp.float32), x, gain)


def _rms_ffi_fwd(x: Array, gain: Array) -> tuple[Array, tuple[Array, Array]]:
    return rmsnorm_ffi(x, gain), (x, gain)


def _rms_ffi_bwd(res: tuple[Array, Array], dy: Array) -> tuple[Array, Array]:
    x, gain = res
    return tuple(_ffi(OPS["rmsnorm"]["ffi_targets"]["bwd"],
                      (jax.ShapeDtypeStruct(x.shape, jnp.float32), jax.ShapeDtypeStruct(gain.shape, jnp.float32)),
                      x, gain, dy))


rmsnorm_ffi.defvjp(_rms_ffi_fwd, _rms_ffi_bwd)


def _rows(a: Array) -> Array:
    """[..., D] -> [R, D] (a scalar-free view the kernels tile by rows)."""
    return a.reshape(-1, a.shape[-1]) if a.ndim != 2 else a


def _pallas() -> Any:
    from jax.experimental import pallas as pl  # imported on first use: only pallas needs it
    return pl


def _rms_pallas_fwd_call(x: Array, gain: Array) -> Array:
    pl = _pallas()
    x2 = _rows(x)
    R, D = x2.shape

    def kernel(x_ref, g_ref, y_ref):  # type: ignore[no-untyped-def]
        v = x_ref[...]
        inv = jax.lax.rsqrt(jnp.mean(v * v, axis=-1, keepdims=True) + NORM_EPS)
        y_ref[...] = v * inv * g_ref[...]

    y = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((R, D), jnp.float32), grid=(R,),
                       in_specs=[pl.BlockSpec((1, D), lambda r: (r, 0)), pl.BlockSpec((1, D), lambda r: (0, 0))],
                       out_specs=pl.BlockSpec((1, D), lambda r: (r, 0)), interpret=True)(x2, gain.reshape(1, D))
    return y.reshape(x.shape)


def _rms_pallas_bwd_call(x: Array, gain: Array, dy: Array) -> tuple[Array, Array]:
    pl = _pallas()
    x2, dy2 = _rows(x), _rows(dy)
    R, D = x2.shape

    def kernel(x_ref, g_ref, dy_ref, dx_ref, dgr_ref):  # type: ignore[no-untyped-def]
        v, g, e = x_ref[...], g_ref[...], dy_ref[...]
        inv = jax.lax.rsqrt(jnp.mean(v * v, axis=-1, keepdims=True) + NORM_EPS)
        dot = jnp.mean(e * g * v, axis=-1, keepdims=True)
        dx_ref[...] = inv * e * g - v * (inv * inv * inv) * dot
        dgr_ref[...] = e * v * inv

    row = pl.BlockSpec((1, D), lambda r: (r, 0))
    dx, dg_rows = pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct((R, D), jnp.float32), jax.ShapeDtypeStruct((R, D), jnp.float32)),
        grid=(R,), in_specs=[row, pl.BlockSpec((1, D), lambda r: (0, 0)), row], out_specs=(row, row),
        interpret=True)(x2, gain.reshape(1, D), dy2)
    # The per-row dgain terms are summed outside the kernel (f32).
    return dx.reshape(x.shape), jnp.sum(dg_rows, axis=0)


@jax.custom_vjp
def rmsnorm_pallas(x: Array, gain: Array) -> Array:
    return _rms_pallas_fwd_call(x, gain)


rmsnorm_pallas.defvjp(lambda x, g: (_rms_pallas_fwd_call(x, g), (x, g)),
                      lambda res, dy: _rms_pallas_bwd_call(res[0], res[1], dy))


# --- swiglu -----------------------------------------------------------------


def swiglu_xla(gate: Array, up: Array) -> Array:
    return jax.nn.silu(gate) * up


@jax.custom_vjp
def swiglu_ffi(gate: Array, up: Array) -> Array:
    return _ffi(OPS["swiglu"]["ffi_targets"]["fwd"], jax.ShapeDtypeStruct(gate.shape, jnp.float32), gate, up)


def _swiglu_ffi_bwd(res: tuple[Array, Array], dh: Array) -> tuple[Array, Array]:
    gate, up = res
    spec = jax.ShapeDtypeStruct(gate.shape, jnp.float32)
    return tuple(_ffi(OPS["swiglu"]["ffi_targets"]["bwd"], (spec, spec), gate, up, dh))


swiglu_ffi.defvjp(lambda g, u: (swiglu_ffi(g, u), (g, u)), _swiglu_ffi_bwd)


def _elementwise_pallas(kernel: Callable[..., None], n_out: int, *arrays: Array) -> Any:
    pl = _pallas()
    shape = arrays[0].shape
    flat = [a.reshape(1, -1) if a.ndim < 2 else _rows(a) for a in arrays]
    R, F = flat[0].shape
    row = pl.BlockSpec((1, F), lambda r: (r, 0))
    outs = tuple(jax.ShapeDtypeStruct((R, F), jnp.float32) for _ in range(n_out))
    res = pl.pallas_call(kernel, out_shape=outs if n_out > 1 else outs[0], grid=(R,), in_specs=[row] * len(flat),
                         out_specs=(row,) * n_out if n_out > 1 else row, interpret=True)(*flat)
    return tuple(r.reshape(shape) for r in res) if n_out > 1 else res.reshape(shape)


def _swiglu_pallas_fwd_call(gate: Array, up: Array) -> Array:
    def kernel(g_ref, u_ref, h_ref):  # type: ignore[no-untyped-def]
        g = g_ref[...]
        h_ref[...] = g * jax.nn.sigmoid(g) * u_ref[...]

    return _elementwise_pallas(kernel, 1, gate, up)


def _swiglu_pallas_bwd_call(gate: Array, up: Array, dh: Array) -> tuple[Array, Array]:
    def kernel(g_ref, u_ref, dh_ref, dg_ref, du_ref):  # type: ignore[no-untyped-def]
        g, u, e = g_ref[...], u_ref[...], dh_ref[...]
        s = jax.nn.sigmoid(g)
        dg_ref[...] = e * u * s * (1.0 + g * (1.0 - s))
        du_ref[...] = e * g * s

    return _elementwise_pallas(kernel, 2, gate, up, dh)


@jax.custom_vjp
def swiglu_pallas(gate: Array, up: Array) -> Array:
    return _swiglu_pallas_fwd_call(gate, up)


swiglu_pallas.defvjp(lambda g, u: (_swiglu_pallas_fwd_call(g, u), (g, u)),
                     lambda res, dh: _swiglu_pallas_bwd_call(res[0], res[1], dh))


# --- cross_entropy ------------------------------------------------------------
#
# The operand boundary: logits [N, V] f32 and targets [N] s32 -> the per-row
# loss ce [N]. The masked mean (sum(ce * mask) / sum(mask)) and the padding
# ids' -1e30 (model.mask_padding) stay jnp glue around the call: the kernel
# then has no mask operand, one output per row, and a backward whose only
# large tensor is the logits gradient itself. Targets get no gradient.

CE_CHUNK = 2048  # the vocabulary chunk of the pallas kernel (the C kernel's too)
CE_ROWS = 8      # the pallas kernel's row block


def cross_entropy_xla(logits: Array, targets: Array) -> Array:
    """model.masked_ce's per-row loss: the reference."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _ce_ffi_fwd_call(logits: Array, targets: Array) -> tuple[Array, Array]:
    n = jax.ShapeDtypeStruct(targets.shape, jnp.float32)
    ce, lse = _ffi(OPS["cross_entropy"]["ffi_targets"]["fwd"], (n, n), logits, targets)
    return ce, lse


@jax.custom_vjp
def cross_entropy_ffi(logits: Array, targets: Array) -> Array:
    return _ce_ffi_fwd_call(logits, targets)[0]


def _ce_ffi_fwd(logits: Array, targets: Array) -> tuple[Array, tuple[Array, Array, Array]]:
    ce, lse = _ce_ffi_fwd_call(logits, targets)
    return ce, (logits, targets, lse)


def _ce_ffi_bwd(res: tuple[Array, Array, Array], dce: Array) -> tuple[Array, None]:
    logits, targets, lse = res
    dl = _ffi(OPS["cross_entropy"]["ffi_targets"]["bwd"], jax.ShapeDtypeStruct(logits.shape, jnp.float32),
              logits, targets, lse, dce)
    return dl, None  # integer targets: no gradient


cross_entropy_ffi.defvjp(_ce_ffi_fwd, _ce_ffi_bwd)


def _ce_pad(logits: Array, targets: Array) -> tuple[Array, Array, int, int]:
    """Rows padded to a multiple of CE_ROWS (zeros, target 0: sliced off
    after) and the vocabulary to a multiple of the chunk (-1e30: weighs 0)."""
    N, V = logits.shape
    C = min(CE_CHUNK, V)
    n_pad, v_pad = -N % CE_ROWS, -V % C
    if v_pad:
        logits = jnp.pad(logits, ((0, 0), (0, v_pad)), constant_values=-1e30)
    if n_pad:
        logits = jnp.pad(logits, ((0, n_pad), (0, 0)))
        targets = jnp.pad(targets, (0, n_pad))
    return logits, targets, C, N


def _ce_pallas_fwd_call(logits: Array, targets: Array) -> tuple[Array, Array]:
    pl = _pallas()
    x, t, C, N = _ce_pad(logits.astype(jnp.float32), targets.astype(jnp.int32))
    Np, Vp = x.shape
    chunks = Vp // C

    def kernel(x_ref, t_ref, ce_ref, lse_ref):  # type: ignore[no-untyped-def]
        tgt = t_ref[...]  # [R, 1]

        def body(c, carry):  # type: ignore[no-untyped-def]
            m, s, xt = carry
            v = x_ref[:, pl.ds(c * C, C)]
            m_new = jnp.maximum(m, jnp.max(v, axis=-1, keepdims=True))
            s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(v - m_new), axis=-1, keepdims=True)
            col = c * C + jax.lax.broadcasted_iota(jnp.int32, v.shape, 1)
            xt = xt + jnp.sum(jnp.where(col == tgt, v, 0.0), axis=-1, keepdims=True)
            return m_new, s, xt

        init = (jnp.full((CE_ROWS, 1), -jnp.inf, jnp.float32), jnp.zeros((CE_ROWS, 1), jnp.float32),
                jnp.zeros((CE_ROWS, 1), jnp.float32))
        m, s, xt = jax.lax.fori_loop(0, chunks, body, init)
        lse = m + jnp.log(s)
        lse_ref[...] = lse
        ce_ref[...] = lse - xt

    rows = pl.BlockSpec((CE_ROWS, 1), lambda r: (r, 0))
    ce, lse = pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct((Np, 1), jnp.float32),) * 2, grid=(Np // CE_ROWS,),
        in_specs=[pl.BlockSpec((CE_ROWS, Vp), lambda r: (r, 0)), rows], out_specs=(rows, rows),
        interpret=True)(x, t.reshape(Np, 1))
    return ce[:N, 0], lse[:N, 0]


def _ce_pallas_bwd_call(logits: Array, targets: Array, lse: Array, dce: Array) -> Array:
    pl = _pallas()
    N, V = logits.shape
    x, t, C, _ = _ce_pad(logits.astype(jnp.float32), targets.astype(jnp.int32))
    Np, Vp = x.shape
    chunks = Vp // C
    lse_p = jnp.pad(lse, (0, Np - N)).reshape(Np, 1)
    dce_p = jnp.pad(dce, (0, Np - N)).reshape(Np, 1)

    def kernel(x_ref, t_ref, lse_ref, dce_ref, dl_ref):  # type: ignore[no-untyped-def]
        tgt, l, g = t_ref[...], lse_ref[...], dce_ref[...]

        def body(c, carry):  # type: ignore[no-untyped-def]
            v = x_ref[:, pl.ds(c * C, C)]
            col = c * C + jax.lax.broadcasted_iota(jnp.int32, v.shape, 1)
            dl_ref[:, pl.ds(c * C, C)] = g * (jnp.exp(v - l) - (col == tgt).astype(jnp.float32))
            return carry

        jax.lax.fori_loop(0, chunks, body, 0)

    rows = pl.BlockSpec((CE_ROWS, 1), lambda r: (r, 0))
    full = pl.BlockSpec((CE_ROWS, Vp), lambda r: (r, 0))
    dl = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((Np, Vp), jnp.float32), grid=(Np // CE_ROWS,),
                        in_specs=[full, rows, rows, rows], out_specs=full,
                        interpret=True)(x, t.reshape(Np, 1), lse_p, dce_p)
    return dl[:N, :V]


@jax.custom_vjp
def cross_entropy_pallas(logits: Array, targets: Array) -> Array:
    return _ce_pallas_fwd_call(logits, targets)[0]


def _ce_pallas_fwd(logits: Array, targets: Array) -> tuple[Array, tuple[Array, Array, Array]]:
    ce, lse = _ce_pallas_fwd_call(logits, targets)
    return ce, (logits, targets, lse)


cross_entropy_pallas.defvjp(_ce_pallas_fwd,
                            lambda res, dce: (_ce_pallas_bwd_call(res[0], res[1], res[2], dce), None))


# --- dispatch ---------------------------------------------------------------

IMPLEMENTATIONS: dict[str, dict[str, Callable[..., Array]]] = {
    "rmsnorm": {"xla": rmsnorm_xla, "ffi": rmsnorm_ffi, "pallas": rmsnorm_pallas},
    "swiglu": {"xla": swiglu_xla, "ffi": swiglu_ffi, "pallas": swiglu_pallas},
    "cross_entropy": {"xla": cross_entropy_xla, "ffi": cross_entropy_ffi, "pallas": cross_entropy_pallas},
}


def call(op: str, impl: str, *args: Array) -> Array:
    """The op through |impl|, or through the contract's fallback when the
    operands are outside the contract (recorded in fallbacks_seen)."""
    if impl != "xla":
        why = _in_contract(op, *args)
        if why is not None:
            fb = OPS[op]["fallback"]
            fallbacks_seen.append((op, impl, fb, why))
            impl = fb
    return IMPLEMENTATIONS[op][impl](*args)


def manifest_entry(kernels: dict[str, str]) -> dict[str, Any]:
    """The manifest's "kernels" object: every op of the contract with the
    implementation the programs use (docs/bundle.md, "Kernels")."""
    ops = []
    for op in CONTRACT["ops"]:
        impl = kernels.get(op["name"], "xla")
        e: dict[str, Any] = {"name": op["name"], "version": op["version"], "impl": impl,
                             "profile_label": op["profile_label"],
                             # the contract row the programs were exported against
                             "contract": {k: v for k, v in op.items() if k != "verify_shapes"}}
        if impl == "ffi":
            e["targets"] = [op["ffi_targets"]["fwd"], op["ffi_targets"]["bwd"]]
        fb = sorted({f[3] for f in fallbacks_seen if f[0] == op["name"]})
        if fb:
            # Some calls took the fallback (the others, if any, still use impl).
            e["fallback"] = op["fallback"]
            e["fallback_reasons"] = fb
        ops.append(e)
    return {"contract_version": CONTRACT["contract_version"], "ops": ops}

