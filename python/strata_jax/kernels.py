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

``auto`` (the config's default) is not an implementation: strata resolves it,
in C, before the model JSON is built, to the contract row's ``default`` for
the plugin's platform (``{"cpu": "ffi", "other": "xla"}``); so a model JSON
never carries it. ``default_impl`` reads the same field (docs/kernels.md,
"Selection").

A call whose operands fall outside the contract (another dtype) takes the
contract's fallback (``xla``) and is recorded (``fallbacks_seen``) so the
exporter can say so in the manifest: never a silent wrong result.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, TypeVar

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

Array = jax.Array

CONTRACT: dict[str, Any] = json.loads(Path(__file__).with_name("kernel_contract.json").read_text(encoding="utf-8"))
OPS: dict[str, dict[str, Any]] = {op["name"]: op for op in CONTRACT["ops"]}
IMPLS = ("xla", "ffi", "pallas")
NORM_EPS = 1e-6  # rmsnorm v1 fixes it (model.NORM_EPS)

# (op, asked, used, why) for every call that fell back, in trace order.
fallbacks_seen: list[tuple[str, str, str, str]] = []

# The implementations, filled by @implements below: IMPLEMENTATIONS[op][impl]
# is the differentiable function a block calls (the contract's first output);
# CONTRACT_FWD/CONTRACT_BWD[op][impl], for an op whose contract forward has
# more outputs than that (attention's o and lse), its two halves, which
# verification and the residual path call.
IMPLEMENTATIONS: dict[str, dict[str, Callable[..., Any]]] = {}
CONTRACT_FWD: dict[str, dict[str, Callable[..., Any]]] = {}
CONTRACT_BWD: dict[str, dict[str, Callable[..., Any]]] = {}
_PARTS = {"": IMPLEMENTATIONS, "fwd": CONTRACT_FWD, "bwd": CONTRACT_BWD}


_F = TypeVar("_F", bound=Callable[..., Any])


def implements(op: str, impl: str, part: str = "") -> Callable[[_F], _F]:
    """Registers the decorated function as implementation |impl| of contract
    op |op| (part "": the differentiable op; "fwd"/"bwd": the contract's
    forward and backward, when they differ from it). The op and the
    implementation must be in the contract: a kernel op is listed once, in
    kernel_contract.json (docs/kernels.md, "How to add a kernel op")."""
    if op not in OPS or impl not in OPS[op]["implementations"]:
        raise ValueError(f"@implements({op!r}, {impl!r}): the contract has no such op or implementation")

    def register(fn: _F) -> _F:
        _PARTS[part].setdefault(op, {})[impl] = fn
        return fn

    return register


def unregistered() -> list[str]:
    """"op/impl" for every implementation the contract lists that no
    function registers (empty when the two agree)."""
    return [f"{op}/{impl}" for op, row in OPS.items() for impl in row["implementations"]
            if impl not in IMPLEMENTATIONS.get(op, {})]


def default_impl(op: str, platform: str) -> str:
    """What kernels.<op>=auto means on PJRT platform |platform| ("cpu", ...):
    the row's "default" entry for it, else its "other" entry, else xla; the
    rule of st_kernel_op_default (src/kernels/contract.c)."""
    d = OPS[op].get("default") or {}
    return str(d.get(platform) or d.get("other") or "xla")


def check_selection(kernels: dict[str, str]) -> None:
    """Raises ValueError naming the key for an unknown op or implementation."""
    for op, impl in kernels.items():
        if op not in OPS:
            raise ValueError(f"kernels.{op}: no such kernel op (the contract has: {', '.join(sorted(OPS))})")
        if impl == "auto":
            raise ValueError(f"kernels.{op}='auto' reached the exporter: strata resolves auto for the plugin's "
                             f"platform before it exports (default_impl); pass an implementation "
                             f"({'|'.join(OPS[op]['implementations'])})")
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


@implements("rmsnorm", "xla")
def rmsnorm_xla(x: Array, gain: Array) -> Array:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + NORM_EPS) * gain


def _ffi(target: str, results: Any, *args: Array) -> Any:
    return jax.ffi.ffi_call(target, results)(*args)


@implements("rmsnorm", "ffi")
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


@implements("rmsnorm", "pallas")
@jax.custom_vjp
def rmsnorm_pallas(x: Array, gain: Array) -> Array:
    return _rms_pallas_fwd_call(x, gain)


rmsnorm_pallas.defvjp(lambda x, g: (_rms_pallas_fwd_call(x, g), (x, g)),
                      lambda res, dy: _rms_pallas_bwd_call(res[0], res[1], dy))


# --- swiglu -----------------------------------------------------------------


@implements("swiglu", "xla")
def swiglu_xla(gate: Array, up: Array) -> Array:
    return jax.nn.silu(gate) * up


@implements("swiglu", "ffi")
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


@implements("swiglu", "pallas")
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


@implements("cross_entropy", "xla")
def cross_entropy_xla(logits: Array, targets: Array) -> Array:
    """model.masked_ce's per-row loss: the reference."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _ce_ffi_fwd_call(logits: Array, targets: Array) -> tuple[Array, Array]:
    n = jax.ShapeDtypeStruct(targets.shape, jnp.float32)
    ce, lse = _ffi(OPS["cross_entropy"]["ffi_targets"]["fwd"], (n, n), logits, targets)
    return ce, lse


@implements("cross_entropy", "ffi")
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


@implements("cross_entropy", "pallas")
@jax.custom_vjp
def cross_entropy_pallas(logits: Array, targets: Array) -> Array:
    return _ce_pallas_fwd_call(logits, targets)[0]


def _ce_pallas_fwd(logits: Array, targets: Array) -> tuple[Array, tuple[Array, Array, Array]]:
    ce, lse = _ce_pallas_fwd_call(logits, targets)
    return ce, (logits, targets, lse)


cross_entropy_pallas.defvjp(_ce_pallas_fwd,
                            lambda res, dce: (_ce_pallas_bwd_call(res[0], res[1], res[2], dce), None))


# --- attention --------------------------------------------------------------
#
# Causal attention after RoPE (contract row "attention"): q [B, T, H, Dh],
# k and v [B, T, KV, Dh] (KV divides H: query head h reads key/value head
# h // (H // KV)), o like q and the log-sum-exp lse [B, H, T] of the masked,
# scaled scores, which the residual path (programs.block_fwd_res) keeps for
# the backward. v1 fixes the scale (1/sqrt(Dh)) and the causal mask, so the
# custom calls carry no attributes. Each implementation has three entry
# points: attention_<impl>(q, k, v) -> o (differentiable: what model.attention
# calls), ATTENTION_FWD[impl](q, k, v) -> (o, lse) and
# ATTENTION_BWD[impl](q, k, v, o, lse, do) -> (dq, dk, dv) (the residual
# path's two halves).
#
# The optional operand segment_ids (s32 [B, T], the contract's "seg" form)
# is a trailing argument of all three: attention_<impl>(q, k, v, segment_ids),
# ATTENTION_FWD[impl](q, k, v, segment_ids), ATTENTION_BWD[impl](q, k, v, o,
# lse, do, segment_ids); query i then attends key j iff j <= i and both carry
# the same id (a packed sequence's documents). Without it every function
# traces exactly what it traced before the operand existed (the plain
# programs, their targets and bundles stay byte-identical); with it the ffi
# form calls its own targets (ffi_targets' seg_fwd / seg_bwd), whose operand
# lists insert segment_ids after v.


def _expand_heads(t: Array, h: int) -> Array:
    g = h // t.shape[2]
    return t if g == 1 else jnp.repeat(t, g, axis=2)


def _att_scores(q: Array, k: Array, seg: Array | None = None) -> Array:
    T, H, Dh = q.shape[1], q.shape[2], q.shape[3]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, _expand_heads(k, H),
                   preferred_element_type=jnp.float32) / jnp.float32(math.sqrt(Dh))
    causal = jnp.tril(jnp.ones((T, T), dtype=jnp.bool_))
    if seg is None:
        return jnp.where(causal[None, None], s, jnp.float32(-1e30))
    same = seg[:, None, :, None] == seg[:, None, None, :]  # [B, 1, Tq, Tk]
    return jnp.where(causal[None, None] & same, s, jnp.float32(-1e30))


@implements("attention", "xla", "fwd")
def attention_fwd_xla(q: Array, k: Array, v: Array, segment_ids: Array | None = None) -> tuple[Array, Array]:
    """(o, lse): the reference, model.attention's math in f32. A masked score
    is -1e30, so it weighs exactly 0 next to the query's own key (always
    visible), and lse is today's log-sum-exp over the visible keys."""
    s = _att_scores(q, k, segment_ids)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), _expand_heads(v, q.shape[2]),
                   preferred_element_type=jnp.float32)
    return o, jax.nn.logsumexp(s, axis=-1)


@implements("attention", "xla")
def attention_xla(q: Array, k: Array, v: Array, segment_ids: Array | None = None) -> Array:
    if segment_ids is None:
        return attention_fwd_xla(q, k, v)[0]
    return attention_fwd_xla(q, k, v, segment_ids)[0]


@implements("attention", "xla", "bwd")
def attention_bwd_xla(q: Array, k: Array, v: Array, o: Array, lse: Array, do: Array,
                      segment_ids: Array | None = None) -> tuple[Array, Array, Array]:
    """p = exp(s - lse), ds = p (dp - rowsum(do * o)) / sqrt(Dh): llama._attention_core_bwd's math in f32."""
    B, T, H, Dh = q.shape
    KV = k.shape[2]
    p = jnp.exp(_att_scores(q, k, segment_ids) - lse[..., None])
    dv = jnp.einsum("bhqk,bqhd->bkhd", p, do, preferred_element_type=jnp.float32)
    dp = jnp.einsum("bqhd,bkhd->bhqk", do, _expand_heads(v, H), preferred_element_type=jnp.float32)
    delta = jnp.transpose(jnp.sum(do * o, axis=-1), (0, 2, 1))
    ds = p * (dp - delta[..., None]) / jnp.float32(math.sqrt(Dh))
    dq = jnp.einsum("bhqk,bkhd->bqhd", ds, _expand_heads(k, H), preferred_element_type=jnp.float32)
    dk = jnp.einsum("bhqk,bqhd->bkhd", ds, q, preferred_element_type=jnp.float32)
    if KV != H:
        dk = dk.reshape(B, T, KV, H // KV, Dh).sum(axis=3)
        dv = dv.reshape(B, T, KV, H // KV, Dh).sum(axis=3)
    return dq, dk, dv


def _att_out_specs(q: Array) -> tuple[Any, Any]:
    B, T, H, _ = q.shape
    return jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct((B, H, T), jnp.float32)


def _att_target(d: str, seg: Array | None) -> str:
    """The ffi target of direction |d| ("fwd"/"bwd"), of the seg form when
    there are segment ids."""
    return OPS["attention"]["ffi_targets"][d if seg is None else "seg_" + d]


@implements("attention", "ffi", "fwd")
def attention_fwd_ffi(q: Array, k: Array, v: Array, segment_ids: Array | None = None) -> tuple[Array, Array]:
    if segment_ids is None:
        return tuple(_ffi(_att_target("fwd", None), _att_out_specs(q), q, k, v))
    return tuple(_ffi(_att_target("fwd", segment_ids), _att_out_specs(q), q, k, v, segment_ids))


@implements("attention", "ffi", "bwd")
def attention_bwd_ffi(q: Array, k: Array, v: Array, o: Array, lse: Array, do: Array,
                      segment_ids: Array | None = None) -> tuple[Array, Array, Array]:
    specs = tuple(jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in (q, k, v))
    if segment_ids is None:
        return tuple(_ffi(_att_target("bwd", None), specs, q, k, v, o, lse, do))
    return tuple(_ffi(_att_target("bwd", segment_ids), specs, q, k, v, segment_ids, o, lse, do))


def _att_vjp(fwd: Callable[..., tuple[Array, Array]], bwd: Callable[..., tuple[Array, Array, Array]]) -> Any:
    @jax.custom_vjp
    def f(q: Array, k: Array, v: Array) -> Array:
        return fwd(q, k, v)[0]

    def f_fwd(q: Array, k: Array, v: Array) -> tuple[Array, tuple[Array, ...]]:
        o, lse = fwd(q, k, v)
        return o, (q, k, v, o, lse)

    f.defvjp(f_fwd, lambda res, do: bwd(*res, do))
    return f


def _att_vjp_seg(fwd: Callable[..., tuple[Array, Array]], bwd: Callable[..., tuple[Array, Array, Array]]) -> Any:
    """_att_vjp's seg form: segment_ids is an integer operand, so no gradient."""
    @jax.custom_vjp
    def f(q: Array, k: Array, v: Array, seg: Array) -> Array:
        return fwd(q, k, v, seg)[0]

    def f_fwd(q: Array, k: Array, v: Array, seg: Array) -> tuple[Array, tuple[Array, ...]]:
        o, lse = fwd(q, k, v, seg)
        return o, (q, k, v, o, lse, seg)

    def f_bwd(res: tuple[Array, ...], do: Array) -> tuple[Any, ...]:
        q, k, v, o, lse, seg = res
        return (*bwd(q, k, v, o, lse, do, seg), None)

    f.defvjp(f_fwd, f_bwd)
    return f


def _att_differentiable(fwd: Callable[..., tuple[Array, Array]], bwd: Callable[..., tuple[Array, Array, Array]]) -> Any:
    """attention_<impl>(q, k, v, segment_ids=None) over the two halves: the
    plain custom_vjp exactly as before the seg form, or the seg one."""
    plain, seg = _att_vjp(fwd, bwd), _att_vjp_seg(fwd, bwd)

    def attention(q: Array, k: Array, v: Array, segment_ids: Array | None = None) -> Array:
        return plain(q, k, v) if segment_ids is None else seg(q, k, v, segment_ids)

    return attention


attention_ffi = implements("attention", "ffi")(_att_differentiable(attention_fwd_ffi, attention_bwd_ffi))

ATT_TILE = 32  # the pallas kernels' query and key tile (the contract's "tile")


def _att_pallas_layout(q: Array, k: Array, v: Array) -> tuple[Array, Array, Array, int]:
    """[B, T, h, Dh] -> [B*h, Tp, Dh], T padded with zeros to a multiple of
    the tile. Padded keys sit after every real query, so the causal mask
    hides them; padded queries are dropped by the caller."""
    T = q.shape[1]
    Tp = -(-T // ATT_TILE) * ATT_TILE

    def lay(t: Array) -> Array:
        B, _, h, Dh = t.shape
        t = jnp.pad(t, ((0, 0), (0, Tp - T), (0, 0), (0, 0)))
        return jnp.transpose(t, (0, 2, 1, 3)).reshape(B * h, Tp, Dh)

    return lay(q), lay(k), lay(v), Tp


def _att_mask(i: Any, j: Any) -> Array:
    qi = i * ATT_TILE + jax.lax.broadcasted_iota(jnp.int32, (ATT_TILE, ATT_TILE), 0)
    kj = j * ATT_TILE + jax.lax.broadcasted_iota(jnp.int32, (ATT_TILE, ATT_TILE), 1)
    return kj <= qi


def _att_seg_pallas(seg: Array, Tp: int) -> Array:
    """segment_ids [B, T] -> [B, Tp] s32; the padding (-1) is a key after
    every real query, hidden by the causal mask like the padded keys."""
    return jnp.pad(seg.astype(jnp.int32), ((0, 0), (0, Tp - seg.shape[1])), constant_values=-1)


def _att_seg_mask(i: Any, j: Any, sq: Array, sk: Array) -> Array:
    """The seg form's mask of query tile i against key tile j: causal and
    the same segment (sq, sk: the tiles' ids, [ATT_TILE] each)."""
    return _att_mask(i, j) & (sq[:, None] == sk[None, :])


@implements("attention", "pallas", "fwd")
def attention_fwd_pallas(q: Array, k: Array, v: Array, segment_ids: Array | None = None) -> tuple[Array, Array]:
    """Flash-style: grid over (b*h, query tile); key tiles up to the diagonal
    in a loop with an online softmax (running max m, sum l, unnormalised o).
    The seg form masks p itself (not only the scores): a key tile before the
    query's segment starts then adds nothing while m is still -1e30."""
    pl = _pallas()
    B, T, H, Dh = q.shape
    KV = k.shape[2]
    g = H // KV
    scale = 1.0 / math.sqrt(Dh)
    q3, k3, v3, Tp = _att_pallas_layout(q, k, v)
    n = Tp // ATT_TILE
    seg = segment_ids is not None

    def kernel(q_ref, k_ref, v_ref, *refs):  # type: ignore[no-untyped-def]
        if seg:
            sq_ref, sk_ref, o_ref, lse_ref = refs
        else:
            o_ref, lse_ref = refs
        i = pl.program_id(1)
        qb = q_ref[0]

        def body(j, carry):  # type: ignore[no-untyped-def]
            m, l, acc = carry
            kb = k_ref[0, pl.ds(j * ATT_TILE, ATT_TILE), :]
            vb = v_ref[0, pl.ds(j * ATT_TILE, ATT_TILE), :]
            if seg:
                mask = _att_seg_mask(i, j, sq_ref[0], sk_ref[0, pl.ds(j * ATT_TILE, ATT_TILE)])
            else:
                mask = _att_mask(i, j)
            s = jnp.where(mask, jnp.dot(qb, kb.T) * scale, jnp.float32(-1e30))
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.exp(s - m_new[:, None])
            if seg:
                p = jnp.where(mask, p, jnp.float32(0))
            alpha = jnp.exp(m - m_new)
            return m_new, l * alpha + jnp.sum(p, axis=-1), acc * alpha[:, None] + jnp.dot(p, vb)

        init = (jnp.full((ATT_TILE,), -1e30, jnp.float32), jnp.zeros((ATT_TILE,), jnp.float32),
                jnp.zeros((ATT_TILE, Dh), jnp.float32))
        m, l, acc = jax.lax.fori_loop(0, i + 1, body, init)
        o_ref[0] = acc / l[:, None]
        lse_ref[0] = m + jnp.log(l)

    kv_map = lambda bh, i: ((bh // H) * KV + (bh % H) // g, 0, 0)  # noqa: E731
    in_specs = [pl.BlockSpec((1, ATT_TILE, Dh), lambda bh, i: (bh, i, 0)),
                pl.BlockSpec((1, Tp, Dh), kv_map), pl.BlockSpec((1, Tp, Dh), kv_map)]
    args = [q3, k3, v3]
    if seg:
        s2 = _att_seg_pallas(segment_ids, Tp)
        in_specs += [pl.BlockSpec((1, ATT_TILE), lambda bh, i: (bh // H, i)),
                     pl.BlockSpec((1, Tp), lambda bh, i: (bh // H, 0))]
        args += [s2, s2]
    o3, lse2 = pl.pallas_call(
        kernel, grid=(B * H, n),
        out_shape=(jax.ShapeDtypeStruct((B * H, Tp, Dh), jnp.float32), jax.ShapeDtypeStruct((B * H, Tp), jnp.float32)),
        in_specs=in_specs,
        out_specs=(pl.BlockSpec((1, ATT_TILE, Dh), lambda bh, i: (bh, i, 0)),
                   pl.BlockSpec((1, ATT_TILE), lambda bh, i: (bh, i))),
        interpret=True)(*args)
    o = jnp.transpose(o3.reshape(B, H, Tp, Dh)[:, :, :T], (0, 2, 1, 3))
    return o, lse2.reshape(B, H, Tp)[:, :, :T]


@implements("attention", "pallas", "bwd")
def attention_bwd_pallas(q: Array, k: Array, v: Array, o: Array, lse: Array, do: Array,
                         segment_ids: Array | None = None) -> tuple[Array, Array, Array]:
    """Two kernels, p recomputed from lse per tile: dq over (b*h, query
    tile) looping over key tiles; dk and dv per query head over (b*h, key
    tile) looping over query tiles, summed over each key/value group
    outside the kernel. delta = rowsum(do * o) is computed once, outside.
    The seg form adds each tile's segment ids to the mask."""
    pl = _pallas()
    B, T, H, Dh = q.shape
    KV = k.shape[2]
    g = H // KV
    scale = 1.0 / math.sqrt(Dh)
    q3, k3, v3, Tp = _att_pallas_layout(q, k, v)
    o3, do3 = _att_pallas_layout(o, do, do)[:2]
    n = Tp // ATT_TILE
    pad = lambda t: jnp.pad(t.reshape(B * H, T), ((0, 0), (0, Tp - T)))  # noqa: E731
    lse2 = pad(lse)
    delta2 = jnp.sum(o3 * do3, axis=-1)
    kv_map = lambda bh, i: ((bh // H) * KV + (bh % H) // g, 0, 0)  # noqa: E731
    seg = segment_ids is not None
    s2 = _att_seg_pallas(segment_ids, Tp) if seg else None

    def tile_p(qb, kb, lb, i, j, segs=None):  # type: ignore[no-untyped-def]
        s = jnp.dot(qb, kb.T) * scale
        mask = _att_mask(i, j) if segs is None else _att_seg_mask(i, j, *segs)
        return jnp.where(mask, jnp.exp(s - lb[:, None]), jnp.float32(0))

    def dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref, *refs):  # type: ignore[no-untyped-def]
        if seg:
            sq_ref, sk_ref, dq_ref = refs
        else:
            (dq_ref,) = refs
        i = pl.program_id(1)
        qb, dob, lb, db = q_ref[0], do_ref[0], lse_ref[0], dl_ref[0]

        def body(j, acc):  # type: ignore[no-untyped-def]
            kb = k_ref[0, pl.ds(j * ATT_TILE, ATT_TILE), :]
            vb = v_ref[0, pl.ds(j * ATT_TILE, ATT_TILE), :]
            segs = (sq_ref[0], sk_ref[0, pl.ds(j * ATT_TILE, ATT_TILE)]) if seg else None
            p = tile_p(qb, kb, lb, i, j, segs)
            ds = p * (jnp.dot(dob, vb.T) - db[:, None])
            return acc + jnp.dot(ds, kb) * scale

        dq_ref[0] = jax.lax.fori_loop(0, i + 1, body, jnp.zeros((ATT_TILE, Dh), jnp.float32))

    qrow = pl.BlockSpec((1, ATT_TILE, Dh), lambda bh, i: (bh, i, 0))
    vrow = pl.BlockSpec((1, ATT_TILE), lambda bh, i: (bh, i))
    in_specs = [qrow, pl.BlockSpec((1, Tp, Dh), kv_map), pl.BlockSpec((1, Tp, Dh), kv_map), qrow, vrow, vrow]
    args = [q3, k3, v3, do3, lse2, delta2]
    if seg:
        in_specs += [pl.BlockSpec((1, ATT_TILE), lambda bh, i: (bh // H, i)),
                     pl.BlockSpec((1, Tp), lambda bh, i: (bh // H, 0))]
        args += [s2, s2]
    dq3 = pl.pallas_call(
        dq_kernel, grid=(B * H, n), out_shape=jax.ShapeDtypeStruct((B * H, Tp, Dh), jnp.float32),
        in_specs=in_specs, out_specs=qrow, interpret=True)(*args)

    def dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref, *refs):  # type: ignore[no-untyped-def]
        if seg:
            sq_ref, sk_ref, dk_ref, dv_ref = refs
        else:
            dk_ref, dv_ref = refs
        j = pl.program_id(1)
        kb, vb = k_ref[0], v_ref[0]

        def body(i, carry):  # type: ignore[no-untyped-def]
            dk, dv = carry
            qb = q_ref[0, pl.ds(i * ATT_TILE, ATT_TILE), :]
            dob = do_ref[0, pl.ds(i * ATT_TILE, ATT_TILE), :]
            lb = lse_ref[0, pl.ds(i * ATT_TILE, ATT_TILE)]
            db = dl_ref[0, pl.ds(i * ATT_TILE, ATT_TILE)]
            segs = (sq_ref[0, pl.ds(i * ATT_TILE, ATT_TILE)], sk_ref[0]) if seg else None
            p = tile_p(qb, kb, lb, i, j, segs)
            ds = p * (jnp.dot(dob, vb.T) - db[:, None])
            return dk + jnp.dot(ds.T, qb) * scale, dv + jnp.dot(p.T, dob)

        z = jnp.zeros((ATT_TILE, Dh), jnp.float32)
        dk_ref[0], dv_ref[0] = jax.lax.fori_loop(j, n, body, (z, z))

    full = pl.BlockSpec((1, Tp, Dh), lambda bh, j: (bh, 0, 0))
    fullv = pl.BlockSpec((1, Tp), lambda bh, j: (bh, 0))
    kvtile = pl.BlockSpec((1, ATT_TILE, Dh), lambda bh, j: ((bh // H) * KV + (bh % H) // g, j, 0))
    out = pl.BlockSpec((1, ATT_TILE, Dh), lambda bh, j: (bh, j, 0))
    in_specs = [full, kvtile, kvtile, full, fullv, fullv]
    args = [q3, k3, v3, do3, lse2, delta2]
    if seg:
        in_specs += [pl.BlockSpec((1, Tp), lambda bh, j: (bh // H, 0)),
                     pl.BlockSpec((1, ATT_TILE), lambda bh, j: (bh // H, j))]
        args += [s2, s2]
    dk3, dv3 = pl.pallas_call(
        dkv_kernel, grid=(B * H, n),
        out_shape=(jax.ShapeDtypeStruct((B * H, Tp, Dh), jnp.float32),) * 2,
        in_specs=in_specs, out_specs=(out, out),
        interpret=True)(*args)

    def back(t: Array, h: int) -> Array:
        return jnp.transpose(t.reshape(B, h, Tp, Dh)[:, :, :T], (0, 2, 1, 3))

    dk = dk3.reshape(B, KV, g, Tp, Dh).sum(axis=2).reshape(B * KV, Tp, Dh)
    dv = dv3.reshape(B, KV, g, Tp, Dh).sum(axis=2).reshape(B * KV, Tp, Dh)
    return back(dq3, H), back(dk, KV), back(dv, KV)


attention_pallas = implements("attention", "pallas")(_att_differentiable(attention_fwd_pallas, attention_bwd_pallas))

ATTENTION_FWD: dict[str, Callable[..., tuple[Array, Array]]] = CONTRACT_FWD["attention"]
ATTENTION_BWD: dict[str, Callable[..., tuple[Array, Array, Array]]] = CONTRACT_BWD["attention"]


def _att_impl(impl: str, *args: Array) -> str:
    """|impl|, or the contract's fallback (recorded) for operands outside it
    (q, k, v, and segment_ids when given)."""
    if impl != "xla":
        why = _in_contract("attention", *args)
        if why is not None:
            fb = OPS["attention"]["fallback"]
            fallbacks_seen.append(("attention", impl, fb, why))
            return fb
    return impl


def _att_res_vjp(impl: str, with_seg: bool) -> Any:
    """(q, k, v[, segment_ids]) -> (o, lse) through |impl|, differentiable: the
    tensor-parallel plain block (tensor_parallel.block_fwd_local) differentiates its
    residual forward. o's cotangent goes to the backward target; lse's own
    gradient (ds += dlse p) is not in the contract's backward, so a nonzero
    one (nothing in the model makes one) takes the reference's gradient."""
    fwd, bwd = ATTENTION_FWD[impl], ATTENTION_BWD[impl]
    if not with_seg:
        @jax.custom_vjp
        def f(q: Array, k: Array, v: Array) -> tuple[Array, Array]:
            return fwd(q, k, v)

        def f_fwd(q: Any, k: Any, v: Any) -> tuple[tuple[Array, Array], tuple[Array, ...]]:
            q, k, v = q.value, k.value, v.value
            o, lse = fwd(q, k, v)
            return (o, lse), (q, k, v, o, lse)

        def f_bwd(res: tuple[Array, ...], cts: tuple[Any, Any]) -> tuple[Array, Array, Array]:
            q, k, v, o, lse = res
            do, dlse = cts
            do = jnp.zeros_like(o) if isinstance(do, SymbolicZero) else do
            if not isinstance(dlse, SymbolicZero):
                return jax.vjp(attention_fwd_xla, q, k, v)[1]((do, dlse))
            return bwd(q, k, v, o, lse, do)

        f.defvjp(f_fwd, f_bwd, symbolic_zeros=True)
        return f

    @jax.custom_vjp
    def g(q: Array, k: Array, v: Array, seg: Array) -> tuple[Array, Array]:
        return fwd(q, k, v, seg)

    def g_fwd(q: Any, k: Any, v: Any, seg: Any) -> tuple[tuple[Array, Array], tuple[Array, ...]]:
        q, k, v, seg = q.value, k.value, v.value, seg.value
        o, lse = fwd(q, k, v, seg)
        return (o, lse), (q, k, v, o, lse, seg)

    def g_bwd(res: tuple[Array, ...], cts: tuple[Any, Any]) -> tuple[Any, ...]:
        q, k, v, o, lse, seg = res
        do, dlse = cts
        do = jnp.zeros_like(o) if isinstance(do, SymbolicZero) else do
        if not isinstance(dlse, SymbolicZero):
            return (*jax.vjp(lambda a, b, c: attention_fwd_xla(a, b, c, seg), q, k, v)[1]((do, dlse)), None)
        return (*bwd(q, k, v, o, lse, do, seg), None)

    g.defvjp(g_fwd, g_bwd, symbolic_zeros=True)
    return g


_ATT_RES: dict[tuple[str, bool], Any] = {}


def attention_res(impl: str, q: Array, k: Array, v: Array, segment_ids: Array | None = None) -> tuple[Array, Array]:
    """The residual path's forward: (o, lse) through |impl| (programs.block_fwd_res)."""
    if segment_ids is None:
        impl = _att_impl(impl, q, k, v)
        if impl == "xla":
            return attention_fwd_xla(q, k, v)
        if (impl, False) not in _ATT_RES:
            _ATT_RES[impl, False] = _att_res_vjp(impl, False)
        return _ATT_RES[impl, False](q, k, v)
    impl = _att_impl(impl, q, k, v, segment_ids)
    if impl == "xla":
        return attention_fwd_xla(q, k, v, segment_ids)
    if (impl, True) not in _ATT_RES:
        _ATT_RES[impl, True] = _att_res_vjp(impl, True)
    return _ATT_RES[impl, True](q, k, v, segment_ids)


def attention_res_bwd(impl: str, q: Array, k: Array, v: Array, o: Array, lse: Array,
                      do: Array, segment_ids: Array | None = None) -> tuple[Array, Array, Array]:
    """The residual path's backward: (dq, dk, dv) through |impl| (programs.block_bwd_res)."""
    if segment_ids is None:
        return ATTENTION_BWD[_att_impl(impl, q, k, v)](q, k, v, o, lse, do)
    return ATTENTION_BWD[_att_impl(impl, q, k, v, segment_ids)](q, k, v, o, lse, do, segment_ids)


# --- dispatch ---------------------------------------------------------------


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
                             # (config_doc is the C side's: the schema's doc of kernels.<op>)
                             "contract": {k: v for k, v in op.items() if k not in ("verify_shapes", "config_doc")}}
        if impl == "ffi":
            # every target the op's programs may call: fwd and bwd, then an
            # optional operand's form (attention's seg_fwd, seg_bwd)
            e["targets"] = list(op["ffi_targets"].values())
        fb = sorted({f[3] for f in fallbacks_seen if f[0] == op["name"]})
        if fb:
            # Some calls took the fallback (the others, if any, still use impl).
            e["fallback"] = op["fallback"]
            e["fallback_reasons"] = fb
        ops.append(e)
    return {"contract_version": CONTRACT["contract_version"], "ops": ops}

