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

from . import layers as L
from . import llama
from . import model as M
from . import optimizers as O
from . import registry as R
from .config import ModelConfig
from .llama import RESIDUALS, block_bwd_res, block_fwd_res  # noqa: F401  (programs.<name>, as before llama.py)
from .optim import adamw_update, sqnorm
from .registry import BlockKind

Array = jax.Array
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


ShapeFn = Callable[[str, tuple[int, ...]], tuple[int, ...]]


def _specs(cfg: ModelConfig, names: tuple[str, ...], role: str, prefix: str = "", fsdp: int = 1,
           local: ShapeFn | None = None, group: str | None = None) -> list[TensorSpec]:
    def shape(n: str) -> tuple[int, ...]:
        s = M.param_shape(cfg, n, group)
        return shard_shape(local(n, s) if local else s, fsdp)
    return [TensorSpec(prefix + n, shape(n), "f32", role) for n in names]


def shard_shape(shape: tuple[int, ...], fsdp: int) -> tuple[int, ...]:
    """One device's block of a parameter sharded over |fsdp| devices along
    dim 0: ceil(d0 / fsdp) rows, the last blocks zero-padded (the layout of
    the fsdp collectives, parallel.py)."""
    if fsdp == 1 or not shape:
        return tuple(shape)
    return (-(-shape[0] // fsdp),) + tuple(shape[1:])


def positions_spec(cfg: ModelConfig, mb: int | None = None) -> list[TensorSpec]:
    """[positions] under packing "pack" (s32 [mb, T], role "batch": each
    token's position in its document, docs/model.md "Packing"), else []:
    the block programs take it right after x, embed_fwd/embed_bwd right
    after tokens."""
    if not cfg.packed:
        return []
    return [TensorSpec("positions", (cfg.microbatch_size if mb is None else mb, cfg.seq_len), "s32", "batch")]


def groups_of(cfg: ModelConfig) -> tuple[str, ...]:
    """The parameter groups, in optimizer order: embed, one per distinct block kind, head."""
    return ("embed",) + tuple(k.group_name for k in R.kinds_of(cfg)) + ("head",)


def build_programs(cfg: ModelConfig) -> list[Program]:
    """Every program of the bundle, in manifest order. Independent of n_layers.

    The block programs come from the block kinds the stack uses
    (registry.py), one set per distinct kind: kind_programs."""
    mb, T, D = cfg.microbatch_size, cfg.seq_len, cfg.d_model
    tied = cfg.tie_embeddings
    head = M.head_param_names(cfg)
    nh = len(head)
    kinds = [kind_programs(cfg, k) for k in R.kinds_of(cfg)]

    seed = _scalar("seed", "s32")
    tokens = TensorSpec("tokens", (mb, T), "s32", "batch")
    targets = TensorSpec("targets", (mb, T), "s32", "batch")
    mask = TensorSpec("mask", (mb, T), "f32", "batch")
    x = TensorSpec("x", (mb, T, D), "f32", "activation")
    dx = TensorSpec("dx", (mb, T, D), "f32", "activation_grad")
    loss = TensorSpec("loss", (), "f32", "loss")
    wte = _specs(cfg, ("wte",), "param")
    grad_wte = _specs(cfg, ("wte",), "grad", "grad_")
    # The embedding group: wte, and the gpt2 family's wpe (M.embed_param_names).
    enames = M.embed_param_names(cfg)
    ne = len(enames)
    emb = _specs(cfg, enames, "param")
    pos = positions_spec(cfg)
    npos = len(pos)

    def embed_init(s: Array) -> tuple[Array, ...]:
        p = M.init_embed(cfg, s)
        return tuple(p[n] for n in enames)

    def head_init(s: Array) -> tuple[Array, ...]:
        p = M.init_head(cfg, s)
        return tuple(p[n] for n in head)

    def embed_fwd(*args: Array) -> tuple[Array, ...]:
        if npos:
            return (M.embed(cfg, dict(zip(enames, args[:ne])), args[ne], positions=args[ne + 1]),)
        return (M.embed(cfg, dict(zip(enames, args[:ne])), args[ne]),)

    def embed_bwd(*args: Array) -> tuple[Array, ...]:
        tok, g = args[ne], args[ne + 1 + npos]
        ps = args[ne + 1] if npos else None
        _, vjp = jax.vjp(lambda p_: M.embed(cfg, p_, tok, positions=ps), dict(zip(enames, args[:ne])))
        (dp,) = vjp(g)
        return tuple(dp[n] for n in enames)

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

    def role(r: str) -> list[Program]:
        return [k[r] for k in kinds if r in k]

    head_in = _specs(cfg, head, "param") + (wte if tied else []) + [x, targets, mask]
    progs = [Program("embed_init", embed_init, [seed], emb)] + role("init") + [
        Program("head_init", head_init, [seed], _specs(cfg, head, "param")),
        Program("embed_fwd", embed_fwd, emb + [tokens] + pos, [x]),
        Program("embed_bwd", embed_bwd, emb + [tokens] + pos + [dx], _specs(cfg, enames, "grad", "grad_")),
    ] + [p for k in kinds for p in (k["fwd"], k["bwd"])] + [
        Program("head_loss", head_loss, head_in,
                [loss] + _specs(cfg, head, "grad", "grad_") + (grad_wte if tied else []) + [dx]),
        Program("head_eval", head_eval, head_in, [loss]),
    ]
    if tied and ne > 1:
        # The tied head's dwte added to embed_bwd's: the group's accum_embed
        # takes every parameter of the group (bundle.md, "Program tables").
        def embed_accum_tied(a: Array, b: Array) -> tuple[Array, ...]:
            return (a + b,)

        progs.append(Program("embed_accum_tied", embed_accum_tied,
                             _specs(cfg, ("wte",), "grad", "a_") + _specs(cfg, ("wte",), "grad", "b_"), grad_wte, (0,)))
    for g in groups_of(cfg):
        progs += _group_programs(cfg, g)
    progs += [p for k in kinds for p in (k["fwd_res"], k["bwd_res"])]
    progs += sample_programs(cfg, kinds)
    progs += numerics_programs(cfg)
    return progs


# Columns of the adamw_stats_<group> programs' "stats" output, one row per
# parameter (docs/diagnostics.md, "What is measured"): the parameter after
# the update, the update applied (new - old) and the gradient as it came in.
NUMERICS_COLUMNS = ("param_sumsq", "update_sumsq", "update_maxabs", "update_nonfinite",
                    "grad_sumsq", "grad_maxabs", "grad_nonfinite", "numel")
# Columns of act_stats's output.
ACT_STATS_COLUMNS = ("sumsq", "maxabs", "nonfinite")


def tensor_stats(a: Array) -> tuple[Array, Array, Array]:
    """Sum of squares and largest |x| of the finite elements, and the count
    of the others, f32: one NaN leaves the first two readable (XLA's max
    does not reliably propagate NaN either) and is counted."""
    a = a.astype(jnp.float32)
    ok = jnp.isfinite(a)
    f = jnp.where(ok, a, 0.0)
    return (jnp.sum(f * f), jnp.max(jnp.abs(f)), jnp.sum(jnp.logical_not(ok)).astype(jnp.float32))


def numerics_programs(cfg: ModelConfig) -> list[Program]:
    """diag.numerics (docs/diagnostics.md): act_stats(x) -> f32[3] for a
    block's output or input gradient, and per group adamw_stats_<group>:
    adamw_<group> that also returns f32[n, 8] (NUMERICS_COLUMNS) of its n
    parameters. One device only (no fsdp or tensor variants)."""
    mb, T, D = cfg.microbatch_size, cfg.seq_len, cfg.d_model

    def act_stats(x: Array) -> tuple[Array, ...]:
        return (jnp.stack(tensor_stats(x)),)

    progs = [Program("act_stats", act_stats, [TensorSpec("x", (mb, T, D), "f32", "activation")],
                     [TensorSpec("stats", (len(ACT_STATS_COLUMNS),), "f32", "metric")])]
    for g in groups_of(cfg):
        progs.append(_adamw_stats(cfg, g) if cfg.optimizer is None else _update_program(cfg, g, stats=True))
    return progs


def _adamw_stats(cfg: ModelConfig, group: str) -> Program:
    names = M.group_param_names(cfg, group)
    n = len(names)
    decay = [len(M.param_shape(cfg, p, group)) >= 2 for p in names]

    def adamw_stats(*args: Array) -> tuple[Array, ...]:
        p, g, m, v = args[:n], args[n:2 * n], args[2 * n:3 * n], args[3 * n:4 * n]
        step, lr, gscale, hyper = args[4 * n:]
        new_p, new_m, new_v = adamw_update(p, g, m, v, decay, step, lr, gscale, hyper)
        rows = []
        for old, new, gi in zip(p, new_p, g, strict=True):
            u_sq, u_max, u_bad = tensor_stats(new - old)
            g_sq, g_max, g_bad = tensor_stats(gi)
            p_sq = tensor_stats(new)[0]
            rows.append(jnp.stack([p_sq, u_sq, u_max, u_bad, g_sq, g_max, g_bad, jnp.float32(new.size)]))
        return tuple(new_p) + tuple(new_m) + tuple(new_v) + (jnp.stack(rows),)

    params = _specs(cfg, names, "param", group=group)
    grads = _specs(cfg, names, "grad", "grad_", group=group)
    m = _specs(cfg, names, "opt_m", "m_", group=group)
    v = _specs(cfg, names, "opt_v", "v_", group=group)
    scalars = [_scalar("step"), _scalar("lr"), _scalar("gscale"), TensorSpec("hyper", (4,), "f32", "scalar")]
    stats = TensorSpec("stats", (n, len(NUMERICS_COLUMNS)), "f32", "metric")
    return Program(f"adamw_stats_{group}", adamw_stats, params + grads + m + v + scalars, params + m + v + [stats],
                   tuple(range(n)) + tuple(range(2 * n, 4 * n)))


def kind_roles(cfg: ModelConfig, kind: BlockKind) -> dict[str, str]:
    """Role -> program name of a block kind (the layer table's "programs")."""
    roles = ["init", "fwd", "bwd", "fwd_res", "bwd_res"] + (["prefill", "decode"] if kind.decode else [])
    return {r: f"{kind.program_prefix}_{r}" for r in roles}


def kind_programs(cfg: ModelConfig, kind: BlockKind) -> dict[str, Program]:
    """A block kind's programs by role (docs/bundle.md, "Program tables"):
    init, fwd, bwd, fwd_res, bwd_res, and prefill/decode when the kind has them."""
    mb, T, D, Dh = cfg.microbatch_size, cfg.seq_len, cfg.d_model, cfg.head_dim
    names = kind.params(cfg)
    nb = len(names)
    grp = kind.group_name
    name = {r: n for r, n in kind_roles(cfg, kind).items()}
    x = TensorSpec("x", (mb, T, D), "f32", "activation")
    y = TensorSpec("y", (mb, T, D), "f32", "activation")
    dx = TensorSpec("dx", (mb, T, D), "f32", "activation_grad")
    dy = TensorSpec("dy", (mb, T, D), "f32", "activation_grad")
    params = _specs(cfg, names, "param", group=grp)
    grads = _specs(cfg, names, "grad", "grad_", group=grp)
    res = [TensorSpec(n, s, dt, "residual") for n, s, dt in (kind.residuals(cfg) if kind.residuals else [])]
    nr = len(res)

    mets = [TensorSpec(n, s, "f32", "metric") for n, s in (kind.metrics(cfg) if kind.metrics else [])]
    assert not mets or (kind.fwd_metrics and kind.objective and kind.fwd_res is None), kind.name

    def init(s: Array, layer: Array, n_layers: Array) -> tuple[Array, ...]:
        p = kind.init(cfg, s, layer, n_layers)
        return tuple(p[n] for n in names)

    # Under packing "pack" every program below takes positions right after x
    # (np_ = 1) and traces its body inside layers.packed(positions).
    pos = positions_spec(cfg)
    np_ = len(pos)

    def _at(args: tuple[Array, ...]) -> Any:
        return L.packed(args[nb + 1] if np_ else None)

    def fwd(*args: Array) -> tuple[Array, ...]:
        p, xin = dict(zip(names, args[:nb])), args[nb]
        with _at(args):
            if kind.fwd_metrics is not None:
                yv, m = kind.fwd_metrics(cfg, p, xin)
                return (yv,) + tuple(m)
            return (kind.fwd(cfg, p, xin),)

    def bwd(*args: Array) -> tuple[Array, ...]:
        p, xin, g = dict(zip(names, args[:nb])), args[nb], args[nb + 1 + np_]
        with _at(args):
            if kind.fwd_metrics is not None:
                # The layer's share of the loss is differentiated here: its seed is 1.
                def f(p_: dict[str, Array], x_: Array) -> tuple[Array, Array]:
                    yv, m = kind.fwd_metrics(cfg, p_, x_)  # type: ignore[misc]
                    return yv, kind.objective(cfg, m)  # type: ignore[misc]
                _, vjp = jax.vjp(f, p, xin)
                dp, dxin = vjp((g, jnp.float32(1.0)))
            else:
                _, vjp = jax.vjp(lambda p_, x_: kind.fwd(cfg, p_, x_), p, xin)
                dp, dxin = vjp(g)
        return tuple(dp[n] for n in names) + (dxin,)

    def fwd_res(*args: Array) -> tuple[Array, ...]:
        if kind.fwd_res is None:  # keeps nothing: bwd_res recomputes (registry.py)
            return fwd(*args)
        with _at(args):
            yv, r = kind.fwd_res(cfg, dict(zip(names, args[:nb])), args[nb])
        # Residuals kept in the compute dtype are cast here (residual_dtype).
        return (yv,) + tuple(v.astype(_DTYPES[s.dtype]) for v, s in zip(r, res, strict=True))

    def bwd_res(*args: Array) -> tuple[Array, ...]:
        if kind.bwd_res is None:
            return bwd(*args)
        p, xin = dict(zip(names, args[:nb])), args[nb]
        r, g = tuple(args[nb + 1 + np_:nb + 1 + np_ + nr]), args[nb + 1 + np_ + nr]
        with _at(args):
            dp, dxin = kind.bwd_res(cfg, p, xin, r, g)
        return tuple(dp[n] for n in names) + (dxin,)

    # The lowered module is named after the function (module @jit_<name>):
    # init, fwd and bwd after their program, the others after their role, as
    # llama's were before kinds (so its program texts did not change).
    for r, f in (("init", init), ("fwd", fwd), ("bwd", bwd)):
        f.__name__ = f.__qualname__ = name[r]
    out = {
        "init": Program(name["init"], init, [_scalar("seed", "s32"), _scalar("layer", "s32"), _scalar("n_layers", "s32")],
                        params),
        "fwd": Program(name["fwd"], fwd, params + [x] + pos, [y] + mets),
        "bwd": Program(name["bwd"], bwd, params + [x] + pos + [dy], grads + [dx]),
        "fwd_res": Program(name["fwd_res"], fwd_res, params + [x] + pos, [y] + mets + res),
        "bwd_res": Program(name["bwd_res"], bwd_res, params + [x] + pos + res + [dy], grads + [dx]),
    }
    if kind.decode is not None and kind.prefill is not None:
        prefill_fn, decode_fn = kind.prefill, kind.decode
        xs = TensorSpec("x", (1, T, D), "f32", "activation")
        ys = TensorSpec("y", (1, T, D), "f32", "activation")
        x1 = TensorSpec("x", (1, 1, D), "f32", "activation")
        y1 = TensorSpec("y", (1, 1, D), "f32", "activation")
        kc = TensorSpec("k_cache", (1, T, cfg.kv_heads, Dh), "f32", "cache")
        vc = TensorSpec("v_cache", (1, T, cfg.kv_heads, Dh), "f32", "cache")

        def prefill(*args: Array) -> tuple[Array, ...]:
            return tuple(prefill_fn(cfg, dict(zip(names, args[:nb])), args[nb]))

        def decode(*args: Array) -> tuple[Array, ...]:
            xin, k_, v_, pos = args[nb:]
            return tuple(decode_fn(cfg, dict(zip(names, args[:nb])), xin, k_, v_, pos))

        out["prefill"] = Program(name["prefill"], prefill, params + [xs], [ys, kc, vc])
        out["decode"] = Program(name["decode"], decode, params + [x1, kc, vc, _scalar("pos", "s32")], [y1, kc, vc],
                                (nb + 1, nb + 2))
    return out


# --- residual-keeping block programs (sched.remat) -------------------------------
#
# llama's pair, block_fwd_res and block_bwd_res, is llama.py's (what it
# saves and why is said there); its residuals as the contract's tensors:

def residual_specs(cfg: ModelConfig) -> list[TensorSpec]:
    return [TensorSpec(n, s, dt, "residual") for n, s, dt in llama.residuals(cfg)]


def sample_programs(cfg: ModelConfig, kinds: list[dict[str, Program]] | None = None) -> list[Program]:
    """The generation programs: embed_prefill, embed_decode, each kind's
    prefill and decode (kind_programs), head_logits."""
    if kinds is None:
        kinds = [kind_programs(cfg, k) for k in R.kinds_of(cfg)]
    head = M.head_param_names(cfg)
    nh = len(head)
    T, D, V = cfg.seq_len, cfg.d_model, cfg.vocab_size
    enames = M.embed_param_names(cfg)
    ne = len(enames)
    emb = _specs(cfg, enames, "param")
    wte = _specs(cfg, ("wte",), "param")
    xs = TensorSpec("x", (1, T, D), "f32", "activation")
    x1 = TensorSpec("x", (1, 1, D), "f32", "activation")
    # Learned positions: embed_decode takes the token's position (the block
    # programs' |pos|); embed_prefill's tokens are at positions 0..T-1.
    positions = R.family(cfg) == "gpt2"

    def embed_prefill(*args: Array) -> tuple[Array, ...]:
        return (M.embed(cfg, dict(zip(enames, args[:ne])), args[ne]),)

    def embed_decode(*args: Array) -> tuple[Array, ...]:
        return (M.embed(cfg, dict(zip(enames, args[:ne])), args[ne], args[ne + 1] if positions else 0),)

    def logits(*args: Array) -> tuple[Array, ...]:
        # vocab_size logits: the padding ids (vocab_padded) are cut off, so
        # the sampler never sees them.
        p = dict(zip(head, args[:nh]))
        if not cfg.tie_embeddings:
            return (M.head_logits(cfg, p, None, args[-1])[..., :V],)
        # model.head_logits's h @ wte.T as one dot_general over wte's second
        # dimension: no transpose op, so wte is read once (at batch 1 the
        # transposed copy of wte would be most of the program's bytes).
        h, c = M.final_norm(cfg, p, args[-1]), cfg.cdtype
        w = args[nh] if V == cfg.vocab_rows else args[nh][:V]
        return (jnp.einsum("btd,vd->btv", h.astype(c), w.astype(c), preferred_element_type=jnp.float32),)

    return [
        Program("embed_prefill", embed_prefill, emb + [TensorSpec("tokens", (1, T), "s32", "batch")], [xs]),
        Program("embed_decode", embed_decode if positions else embed_prefill, emb + [TensorSpec("tokens", (1, 1), "s32", "batch")]
                + ([_scalar("pos", "s32")] if positions else []), [x1]),
    ] + [p for k in kinds for p in (k.get("prefill"), k.get("decode")) if p is not None] + [
        Program("head_logits", logits, _specs(cfg, head, "param") + (wte if cfg.tie_embeddings else []) + [x1],
                [TensorSpec("logits", (1, 1, V), "f32", "logits")]),
    ]


def _group_programs(cfg: ModelConfig, group: str, fsdp: int = 1, local: ShapeFn | None = None,
                    tail: str | None = None, sq_weight: Callable[[str], float] | None = None) -> list[Program]:
    """The group's optimizer programs. With |fsdp| > 1 they work on one
    device's fsdp block of each tensor (shard_shape) and are named
    <name>_fsdp<N>: AdamW and the accumulation are elementwise, so a block
    (padding rows stay zero: zero gradient, zero moments, zero update) is
    updated exactly as its rows of the whole tensor would be, and the
    squared norms of the blocks sum to the whole one's. An optimizer that
    needs whole tensors (not elementwise) has no update here on blocks or
    cuts: its update is an SPMD program that gathers them
    (tensor_parallel.whole_update_program). |local| maps a
    parameter's shape to one device's (tensor_parallel's cut), |tail| names
    such a variant. |sq_weight| scales each tensor's squares in sqnorm (a
    tensor replicated over T devices weighs 1/T, so the host can add every
    device's norm once)."""
    names = M.group_param_names(cfg, group)
    n = len(names)
    decay = [len(M.param_shape(cfg, p, group)) >= 2 for p in names]

    def accum(*args: Array) -> tuple[Array, ...]:
        return tuple(a + b for a, b in zip(args[:n], args[n:], strict=True))

    def sqn(*args: Array) -> tuple[Array, ...]:
        if sq_weight is None:
            return (sqnorm(args),)
        return (sum((sqnorm([a]) * sq_weight(nm) for a, nm in zip(args, names, strict=True)), start=jnp.float32(0.0)),)

    def adamw(*args: Array) -> tuple[Array, ...]:
        p, g, m, v = args[:n], args[n:2 * n], args[2 * n:3 * n], args[3 * n:4 * n]
        step, lr, gscale, hyper = args[4 * n:]
        new_p, new_m, new_v = adamw_update(p, g, m, v, decay, step, lr, gscale, hyper)
        return tuple(new_p) + tuple(new_m) + tuple(new_v)

    params = _specs(cfg, names, "param", fsdp=fsdp, local=local, group=group)
    grads = _specs(cfg, names, "grad", "grad_", fsdp=fsdp, local=local, group=group)
    m = _specs(cfg, names, "opt_m", "m_", fsdp=fsdp, local=local, group=group)
    v = _specs(cfg, names, "opt_v", "v_", fsdp=fsdp, local=local, group=group)
    scalars = [_scalar("step"), _scalar("lr"), _scalar("gscale"),
               TensorSpec("hyper", (4,), "f32", "scalar")]
    if tail is None:
        tail = f"_fsdp{fsdp}" if fsdp > 1 else ""
    if cfg.optimizer is not None and (fsdp > 1 or local is not None) and not O.elementwise(O.assignment(cfg)[group]):
        upd = None  # needs whole tensors: an SPMD program (tensor_parallel.whole_update_program)
    elif cfg.optimizer is not None:
        upd = _update_program(cfg, group, fsdp, local, tail)
    else:
        upd = Program(f"adamw_{group}{tail}", adamw, params + grads + m + v + scalars, params + m + v,
                      tuple(range(n)) + tuple(range(2 * n, 4 * n)))
    return [
        Program(f"accum_{group}{tail}", accum,
                _specs(cfg, names, "grad", "a_", fsdp=fsdp, local=local, group=group)
                + _specs(cfg, names, "grad", "b_", fsdp=fsdp, local=local, group=group),
                grads, tuple(range(n))),
        Program(f"sqnorm_{group}{tail}", sqn, grads, [TensorSpec("sqnorm", (), "f32", "metric")]),
    ] + ([upd] if upd is not None else [])


def update_state_specs(cfg: ModelConfig, group: str, fsdp: int = 1,
                       local: ShapeFn | None = None) -> tuple[list[O.StateSlot], list[TensorSpec]]:
    """The group's optimizer state tensors (optimizers.state_layout) and
    their specs: role "opt_<kind>", name "<kind>_<local>". On fsdp blocks or
    tensor cuts (elementwise optimizers only) a state has its parameter's
    local shape."""
    names = M.group_param_names(cfg, group)
    shapes = [M.param_shape(cfg, p, group) for p in names]
    opts = O.assignment(cfg)[group]
    if (fsdp > 1 or local is not None) and not O.elementwise(opts):
        bad = sorted({o for o in opts if not O.OPTIMIZERS[o].elementwise})
        raise ValueError(f"optimizer {', '.join(bad)} ({group} group) on fsdp blocks or tensor-parallel cuts is "
                         f"not built (parallel.fsdp = 1 and parallel.tensor = 1 only)")
    layout = O.state_layout(shapes, opts, O.constants(cfg.optimizer))
    specs = []
    for slot in layout:
        shape = slot.shape
        if fsdp > 1 or local is not None:
            assert shape == shapes[slot.index], (group, slot)  # elementwise: the parameter's shape
            shape = _specs(cfg, (names[slot.index],), "param", fsdp=fsdp, local=local, group=group)[0].shape
        specs.append(TensorSpec(f"{slot.kind}_{names[slot.index]}", shape, slot.dtype, f"opt_{slot.kind}"))
    return layout, specs


def _update_program(cfg: ModelConfig, group: str, fsdp: int = 1, local: ShapeFn | None = None, tail: str = "",
                    stats: bool = False) -> Program:
    """update_<group><tail> (or update_stats_<group>, diag.numerics: also the
    f32[n, 8] NUMERICS_COLUMNS): params, grads, the state tensors
    (update_state_specs), step, lr, gscale, hyper -> params, states."""
    names = M.group_param_names(cfg, group)
    n = len(names)
    decay = [len(M.param_shape(cfg, p, group)) >= 2 for p in names]
    opts = O.assignment(cfg)[group]
    c = O.constants(cfg.optimizer)
    layout, states = update_state_specs(cfg, group, fsdp, local)
    ns = len(states)

    def update(*args: Array) -> tuple[Array, ...]:
        p, g, s = args[:n], args[n:2 * n], args[2 * n:2 * n + ns]
        step, lr, gscale, hyper = args[2 * n + ns:]
        new_p, new_s = O.group_update(opts, layout, p, g, s, decay, step, lr, gscale, hyper, c)
        if not stats:
            return tuple(new_p) + tuple(new_s)
        rows = []
        for old, new, gi in zip(p, new_p, g, strict=True):
            u_sq, u_max, u_bad = tensor_stats(new - old)
            g_sq, g_max, g_bad = tensor_stats(gi)
            rows.append(jnp.stack([tensor_stats(new)[0], u_sq, u_max, u_bad, g_sq, g_max, g_bad,
                                   jnp.float32(new.size)]))
        return tuple(new_p) + tuple(new_s) + (jnp.stack(rows),)

    params = _specs(cfg, names, "param", fsdp=fsdp, local=local, group=group)
    grads = _specs(cfg, names, "grad", "grad_", fsdp=fsdp, local=local, group=group)
    scalars = [_scalar("step"), _scalar("lr"), _scalar("gscale"), TensorSpec("hyper", (4,), "f32", "scalar")]
    outs = params + states
    if stats:
        outs = outs + [TensorSpec("stats", (n, len(NUMERICS_COLUMNS)), "f32", "metric")]
    name = f"update_stats_{group}" if stats else f"update_{group}{tail}"
    return Program(name, update, params + grads + states + scalars, outs,
                   tuple(range(n)) + tuple(range(2 * n, 2 * n + ns)))


def fsdp_programs(cfg: ModelConfig, fsdp: int, tensor: int = 1,
                  split_dim: Callable[[str, str], int | None] | None = None) -> list[Program]:
    """Every group's optimizer programs on fsdp blocks (_group_programs).

    With |tensor| > 1 (split_dim(group, name): the dimension tensor
    parallelism cuts, None for whole tensors) a block tensor is first cut
    into its tensor block, then into fsdp blocks; and since whole tensors
    lie on all T devices of a tensor group, their squares weigh 1/T in
    sqnorm (exact for a power of two), so that the host sums every device's
    norm once. Named <name>_fsdp<F>_tp<T>."""
    if tensor == 1:
        return [p for g in groups_of(cfg) for p in _group_programs(cfg, g, fsdp)]
    assert split_dim is not None
    out = []
    for g in groups_of(cfg):
        def local(name: str, shape: tuple[int, ...], g: str = g) -> tuple[int, ...]:
            d = split_dim(g, name)
            return shape if d is None else tuple(x // tensor if i == d else x for i, x in enumerate(shape))

        def weight(name: str, g: str = g) -> float:
            return 1.0 if split_dim(g, name) is not None else 1.0 / tensor

        out += _group_programs(cfg, g, fsdp, local, f"_fsdp{fsdp}_tp{tensor}", weight)
    return out


def programs_by_name(cfg: ModelConfig) -> dict[str, Program]:
    return {p.name: p for p in build_programs(cfg)}
