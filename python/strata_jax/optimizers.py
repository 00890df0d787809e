"""The optimizer registry (docs/model.md, "Optimizers").

An optimizer is everything the bundle needs to update the parameters it is
assigned: the state tensors it keeps per parameter (a kind, a shape and a
dtype from the parameter's shape), whether its update is elementwise (then
an fsdp block or a tensor-parallel cut of a tensor is updated exactly as its
elements of the whole tensor would be, so it gets one-device fsdp and tensor
variants; otherwise its update on a sharded mesh is an SPMD program that
gathers whole tensors, tensor_parallel.whole_update_program), and its update. The C side learns nothing optimizer-specific: it sees the
state tensors as inputs of each group's update program (role
"opt_<kind>", name "<kind>_<local>") and keeps one slot per such input.

Which optimizer updates which parameter is the model JSON's "optimizer"
object (config.OptimizerSpec; absent: AdamW everywhere, today's
`adamw_<group>` programs byte for byte); `assignment` resolves it. Every
update takes the gradient times gscale (clip and the microbatch mean, as
adamw_update) and applies decoupled weight decay `lr * wd * p` to the
parameters of rank >= 2 (the `decay` rule), as AdamW does.

To add an optimizer: write its update and state declaration here and
`register` it; the C schema (train.optimizer, src/) must accept its name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from . import config
from . import model as M
from . import registry as R
from .config import ModelConfig, OptimizerSpec
from .optim import adamw_update

Array = jax.Array
Shape = tuple[int, ...]
States = Sequence[dict[str, Array]]  # one {kind: array} per parameter
Result = tuple[list[Array], list[dict[str, Array]]]  # (params, states)

# Adafactor's constants (Shazeer & Stern 2018; optax.adafactor's defaults
# but min_dim_size_to_factor, which strata sets to 0: every parameter of
# rank >= 2 is factored).
ADAFACTOR_DECAY = 0.8  # second-moment decay 1 - t^-0.8
ADAFACTOR_EPS1 = 1e-30  # added to g^2
ADAFACTOR_CLIP = 1.0  # the update's RMS is clipped to this
# Muon's (optax.contrib.muon's defaults): the quintic Newton-Schulz
# coefficients, its steps and the epsilon of the Frobenius normalisation.
MUON_NS_COEFFS = (3.4445, -4.7750, 2.0315)
MUON_NS_STEPS = 5
MUON_EPS = 1e-8


@dataclass(frozen=True)
class StateSpec:
    kind: str  # lowercase letters and digits: the slot is "<kind>:<param>"
    shape: Shape
    dtype: str = "f32"


@dataclass(frozen=True)
class Constants:
    """What the model JSON's optimizer object bakes into the programs."""
    momentum: float = 0.9
    nesterov: bool = False


# (params, grads, states (one {kind: array} per parameter), decay (one bool
# per parameter: rank >= 2), step, lr, gscale, hyper f32[4] = [beta1,
# beta2, eps, weight_decay], constants) -> (params, states).
UpdateFn = Callable[[Sequence[Array], Sequence[Array], Sequence[dict[str, Array]], Sequence[bool], Array, Array,
                     Array, Array, Constants], tuple[list[Array], list[dict[str, Array]]]]


@dataclass(frozen=True)
class Optimizer:
    name: str  # train.optimizer / optimizer_groups value
    kinds: tuple[str, ...]  # every state kind it may declare, in its order
    states: Callable[[Shape, Constants], list[StateSpec]]  # per parameter, from its (full) shape
    update: UpdateFn
    elementwise: bool  # one-device programs on fsdp / tensor blocks; else SPMD updates on gathered tensors
    # Parameters it accepts (None: every one): (shape, group) -> why not, or None.
    refuses: Callable[[Shape, str], str | None] | None = None
    doc: str = ""


OPTIMIZERS: dict[str, Optimizer] = {}
# The fixed order of state kinds in an update program: the order in which the
# registered optimizers first declare them (adamw's m, v first).
KIND_ORDER: list[str] = []


def register(opt: Optimizer) -> Optimizer:
    if opt.name in OPTIMIZERS:
        raise ValueError(f"optimizer {opt.name!r} is registered twice")
    for k in opt.kinds:
        if not k or not all(c.islower() or c.isdigit() for c in k):
            raise ValueError(f"optimizer {opt.name!r}: state kind {k!r} must be lowercase letters and digits")
        if k not in KIND_ORDER:
            KIND_ORDER.append(k)
    OPTIMIZERS[opt.name] = opt
    return opt


# --- the optimizers ---------------------------------------------------------------

def _adamw(p: Sequence[Array], g: Sequence[Array], s: States, decay: Sequence[bool],
           step: Array, lr: Array, gscale: Array, hyper: Array, c: Constants) -> Result:
    new_p, m, v = adamw_update(p, g, [x["m"] for x in s], [x["v"] for x in s], decay, step, lr, gscale, hyper)
    return new_p, [{"m": a, "v": b} for a, b in zip(m, v, strict=True)]


def _decayed(u: Array, p: Array, dec: bool, wd: Array) -> Array:
    return u + wd * p if dec else u


def _sgd(p: Sequence[Array], g: Sequence[Array], s: States, decay: Sequence[bool],
         step: Array, lr: Array, gscale: Array, hyper: Array, c: Constants) -> Result:
    """buf = mu buf + g; u = buf, or g + mu buf (Nesterov); p -= lr (u + wd p)."""
    wd = hyper[3]
    new_p, new_s = [], []
    for pi, gi, si, dec in zip(p, g, s, decay, strict=True):
        gi = gi * gscale
        if c.momentum:
            buf = c.momentum * si["mom"] + gi
            u = gi + c.momentum * buf if c.nesterov else buf
            new_s.append({"mom": buf})
        else:
            u = gi
            new_s.append({})
        new_p.append(pi - lr * _decayed(u, pi, dec, wd))
    return new_p, new_s


def _lion(p: Sequence[Array], g: Sequence[Array], s: States, decay: Sequence[bool],
          step: Array, lr: Array, gscale: Array, hyper: Array, c: Constants) -> Result:
    """u = sign((1 - b1) g + b1 m); m = (1 - b2) g + b2 m; p -= lr (u + wd p)."""
    b1, b2, wd = hyper[0], hyper[1], hyper[3]
    new_p, new_s = [], []
    for pi, gi, si, dec in zip(p, g, s, decay, strict=True):
        gi = gi * gscale
        u = jnp.sign((1.0 - b1) * gi + b1 * si["m"])
        new_s.append({"m": (1.0 - b2) * gi + b2 * si["m"]})
        new_p.append(pi - lr * _decayed(u, pi, dec, wd))
    return new_p, new_s


def factored_dims(shape: Shape) -> tuple[int, int] | None:
    """Adafactor's (d1, d0) of a parameter: its two largest dimensions (d0
    the largest; optax's _factored_dims at min_dim_size_to_factor 0), None
    below rank 2 (an unfactored second moment)."""
    if len(shape) < 2:
        return None
    order = sorted(range(len(shape)), key=lambda i: (shape[i], i))  # numpy's stable argsort
    return order[-2], order[-1]


def _adafactor_states(shape: Shape, c: Constants) -> list[StateSpec]:
    dims = factored_dims(shape)
    if dims is None:
        return [StateSpec("v", shape)]
    d1, d0 = dims
    return [StateSpec("vr", tuple(x for i, x in enumerate(shape) if i != d0)),
            StateSpec("vc", tuple(x for i, x in enumerate(shape) if i != d1))]


def _adafactor(p: Sequence[Array], g: Sequence[Array], s: States, decay: Sequence[bool],
               step: Array, lr: Array, gscale: Array, hyper: Array,
               c: Constants) -> Result:
    """optax.scale_by_factored_rms, then clip_by_block_rms(1), decay, lr."""
    wd = hyper[3]
    rho = 1.0 - jnp.power(step, -ADAFACTOR_DECAY)
    new_p, new_s = [], []
    for pi, gi, si, dec in zip(p, g, s, decay, strict=True):
        gi = gi * gscale
        g2 = gi * gi + ADAFACTOR_EPS1
        dims = factored_dims(pi.shape)
        if dims is not None:
            d1, d0 = dims
            vr = rho * si["vr"] + (1.0 - rho) * jnp.mean(g2, axis=d0)
            vc = rho * si["vc"] + (1.0 - rho) * jnp.mean(g2, axis=d1)
            row_mean = jnp.mean(vr, axis=d1 - 1 if d1 > d0 else d1, keepdims=True)
            u = gi * jnp.expand_dims((vr / row_mean) ** -0.5, d0) * jnp.expand_dims(vc ** -0.5, d1)
            new_s.append({"vr": vr, "vc": vc})
        else:
            v = rho * si["v"] + (1.0 - rho) * g2
            u = gi * v ** -0.5
            new_s.append({"v": v})
        u = u / jnp.maximum(1.0, jnp.sqrt(jnp.mean(u * u)) / ADAFACTOR_CLIP)
        new_p.append(pi - lr * _decayed(u, pi, dec, wd))
    return new_p, new_s


def newton_schulz(x: Array) -> Array:
    """optax.contrib.orthogonalize_via_newton_schulz of a matrix (frobenius
    preconditioning): the wide orientation, x / (|x|_F + eps), then
    MUON_NS_STEPS quintic steps x = a x + (b A + c A A) x, A = x x^T."""
    a, b, c = MUON_NS_COEFFS
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (jnp.linalg.norm(x) + MUON_EPS)
    for _ in range(MUON_NS_STEPS):
        aa = x @ x.T
        x = a * x + (b * aa + c * aa @ aa) @ x
    return x.T if tall else x


def _muon(p: Sequence[Array], g: Sequence[Array], s: States, decay: Sequence[bool],
          step: Array, lr: Array, gscale: Array, hyper: Array, c: Constants) -> Result:
    """optax.contrib.scale_by_muon (Nesterov, beta = momentum) and its width
    scale sqrt(max(1, fan_out / fan_in)) (fan_in = dim 0, the input of
    x @ W), then decay and lr."""
    beta, wd = c.momentum, hyper[3]
    bc_next = 1.0 - jnp.power(jnp.float32(beta), step + 1.0)
    bc_now = 1.0 - jnp.power(jnp.float32(beta), step)
    new_p, new_s = [], []
    for pi, gi, si, dec in zip(p, g, s, decay, strict=True):
        gi = gi * gscale
        mu = (1.0 - beta) * gi + beta * si["mom"]
        mu_hat = beta * (mu / bc_next) + (1.0 - beta) * (gi / bc_now)
        u = newton_schulz(mu_hat) * math.sqrt(max(1.0, pi.shape[1] / pi.shape[0]))
        new_s.append({"mom": mu})
        new_p.append(pi - lr * _decayed(u, pi, dec, wd))
    return new_p, new_s


def _muon_refuses(shape: Shape, group: str) -> str | None:
    if group in ("embed", "head"):
        return f"muon is for the hidden matrices, not the {group} group's parameters"
    if len(shape) != 2:
        return f"muon needs a matrix (rank 2), this parameter has shape {list(shape)}"
    return None


register(Optimizer("adamw", ("m", "v"), lambda s, c: [StateSpec("m", s), StateSpec("v", s)], _adamw, True,
                   doc="AdamW, optim.adamw_update (docs/model.md, \"Step semantics\")"))
register(Optimizer("sgd", ("mom",), lambda s, c: [StateSpec("mom", s)] if c.momentum else [], _sgd, True,
                   doc="SGD with heavy-ball or Nesterov momentum"))
register(Optimizer("lion", ("m",), lambda s, c: [StateSpec("m", s)], _lion, True, doc="Lion (Chen et al. 2023)"))
register(Optimizer("adafactor", ("v", "vr", "vc"), _adafactor_states, _adafactor, False,
                   doc="Adafactor, factored second moments, no first moment"))
register(Optimizer("muon", ("mom",), lambda s, c: [StateSpec("mom", s)], _muon, False, _muon_refuses,
                   doc="Muon: Nesterov momentum orthogonalised by Newton-Schulz"))


# --- which optimizer updates which parameter ----------------------------------------

SELECTORS = ("embed", "head", "vectors", "matrices")


def constants(spec: OptimizerSpec | None) -> Constants:
    return Constants() if spec is None else Constants(float(spec.momentum), bool(spec.nesterov))


def _group_names(cfg: ModelConfig) -> tuple[str, ...]:
    return ("embed",) + tuple(k.group_name for k in R.kinds_of(cfg)) + ("head",)


def assignment(cfg: ModelConfig) -> dict[str, tuple[str, ...]]:
    """group -> the optimizer of each of its parameters (group order).

    Without cfg.optimizer: adamw everywhere. Else `default` everywhere
    (muon: the matrices, every other parameter adamw), then each
    "SELECTOR=OPTIMIZER" of `groups` in order on the parameters it selects:
    embed, head, a block group's name (registry.py), vectors (rank 1),
    matrices (rank >= 2 outside embed and head). Raises ValueError."""
    spec = cfg.optimizer
    shapes = {g: [M.param_shape(cfg, n, g) for n in M.group_param_names(cfg, g)] for g in _group_names(cfg)}
    if spec is None:
        return {g: ("adamw",) * len(s) for g, s in shapes.items()}

    def matrix(g: str, shape: Shape) -> bool:
        return g not in ("embed", "head") and len(shape) >= 2

    def known(name: str, where: str) -> str:
        if name not in OPTIMIZERS:
            raise ValueError(f"{where}: unknown optimizer {name!r} (registered: {', '.join(OPTIMIZERS)}; "
                             f"docs/model.md, \"Optimizers\")")
        return name

    known(spec.default, "optimizer.default (train.optimizer)")
    if spec.default == "muon":
        out = {g: ["muon" if matrix(g, s) else "adamw" for s in ss] for g, ss in shapes.items()}
    else:
        out = {g: [spec.default] * len(ss) for g, ss in shapes.items()}
    block_groups = {k.group_name for k in R.KINDS.values()}
    for entry in spec.groups:
        where = f"train.optimizer_groups entry {entry!r}"
        sel, eq, name = entry.partition("=")
        sel, name = sel.strip(), name.strip()
        if not eq or not sel:
            raise ValueError(f"{where}: expected SELECTOR=OPTIMIZER")
        known(name, where)
        if sel not in SELECTORS and sel not in block_groups:
            raise ValueError(f"{where}: unknown selector {sel!r} (one of {', '.join(SELECTORS)}, or a block "
                             f"group: {', '.join(sorted(block_groups))})")
        for g, ss in shapes.items():
            for i, s in enumerate(ss):
                if (sel == g or (sel == "vectors" and len(s) == 1) or (sel == "matrices" and matrix(g, s))):
                    out[g][i] = name
    for g, ss in shapes.items():
        for i, s in enumerate(ss):
            why = OPTIMIZERS[out[g][i]].refuses
            msg = why(s, g) if why is not None else None
            if msg:
                raise ValueError(f"optimizer: {g} parameter {M.group_param_names(cfg, g)[i]!r} is assigned "
                                 f"{out[g][i]}: {msg}")
    return {g: tuple(v) for g, v in out.items()}


def check_config(cfg: ModelConfig) -> None:
    if cfg.optimizer is not None:
        assignment(cfg)


config.add_check(check_config)


# --- a group's update ---------------------------------------------------------------

@dataclass(frozen=True)
class StateSlot:
    kind: str
    index: int  # the parameter's position in its group
    shape: Shape
    dtype: str


def state_layout(shapes: Sequence[Shape], opts: Sequence[str], c: Constants) -> list[StateSlot]:
    """A group's state tensors in program order: by kind (KIND_ORDER), each
    kind over the parameters that have it, in parameter order."""
    per = [{st.kind: st for st in OPTIMIZERS[o].states(tuple(s), c)} for s, o in zip(shapes, opts, strict=True)]
    return [StateSlot(k, i, st[k].shape, st[k].dtype) for k in KIND_ORDER for i, st in enumerate(per) if k in st]


def elementwise(opts: Sequence[str]) -> bool:
    return all(OPTIMIZERS[o].elementwise for o in opts)


def group_update(opts: Sequence[str], layout: Sequence[StateSlot], params: Sequence[Array], grads: Sequence[Array],
                 states: Sequence[Array], decay: Sequence[bool], step: Array, lr: Array, gscale: Array, hyper: Array,
                 c: Constants) -> tuple[list[Array], list[Array]]:
    """One step of a group whose parameter i is updated by opts[i]; |states|
    in |layout|'s order. Returns (params, states) in the same orders."""
    per: list[dict[str, Array]] = [{} for _ in params]
    for slot, a in zip(layout, states, strict=True):
        per[slot.index][slot.kind] = a
    new_p: list[Array | None] = [None] * len(params)
    new_s: list[dict[str, Array]] = [{} for _ in params]
    for name in dict.fromkeys(opts):
        idx = [i for i, o in enumerate(opts) if o == name]
        ps, ss = OPTIMIZERS[name].update([params[i] for i in idx], [grads[i] for i in idx], [per[i] for i in idx],
                                         [decay[i] for i in idx], step, lr, gscale, hyper, c)
        for i, p_, s_ in zip(idx, ps, ss, strict=True):
            new_p[i], new_s[i] = p_, s_
    return [p for p in new_p if p is not None], [new_s[s.index][s.kind] for s in layout]


def unsupported_parallel(cfg: ModelConfig, process_fsdp: int) -> str | None:
    """Why |cfg|'s optimizers cannot run on an fsdp axis across
    |process_fsdp| processes, or None. On devices of one process an
    optimizer that is not elementwise (adafactor, muon) gathers whole
    tensors inside an SPMD update (tensor_parallel.whole_update_program);
    across processes the gathers would be strata's own collectives
    between one-device programs, which are not built."""
    if process_fsdp <= 1:
        return None
    bad = sorted({o for opts in assignment(cfg).values() for o in opts if not OPTIMIZERS[o].elementwise})
    if not bad:
        return None
    return (f"optimizer {', '.join(bad)} with fsdp across {process_fsdp} processes is not built: its update needs "
            f"whole tensors, gathered across processes; only elementwise optimizers "
            f"({', '.join(n for n, o in OPTIMIZERS.items() if o.elementwise)}) run there (docs/model.md, \"Optimizers\")")


def state_bytes(shape: Shape, opt: str, c: Constants = Constants()) -> int:
    """Bytes of one parameter's optimizer state (f32)."""
    return sum(4 * math.prod(st.shape) for st in OPTIMIZERS[opt].states(tuple(shape), c))
