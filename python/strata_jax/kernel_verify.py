"""Programs for ``strata kernels verify`` (docs/kernels.md, "Verification").

``python -m strata_jax.kernel_verify OUTDIR [--op NAME]`` writes, for every op
of the contract, implementation and shape in the op's ``verify_shapes``, a
forward program (the op's inputs -> its output) and a backward program (the
op's inputs and the output's cotangent -> the inputs' gradients, through the
implementation's own ``custom_vjp``), as StableHLO text under
``OUTDIR/programs/``, and ``OUTDIR/index.json``::

    {"contract_version": 1, "cases": [
      {"op": "rmsnorm", "impl": "ffi", "dir": "fwd", "shape": [3, 8],
       "file": "programs/rmsnorm_ffi_fwd_0.mlir",
       "inputs": [[3, 8], [8]], "outputs": [[3, 8]],
       "input_kinds": ["x", "gain"], "rtol": 1e-05, "atol": 1e-06}, ...]}

The ``xla`` case of each (op, shape, dir) is the reference the others are
compared with; strata makes the inputs (seeded, the same for every
implementation), runs every program and compares (src/cli/cmd_kernels.c).
Inputs are f32 but for an integer operand (cross_entropy's targets: s32,
``input_dtypes``; strata fills it with ids in [0, V); attention's optional
segment_ids with runs of segment ids); outputs are f32. An op with an
optional input is exported in both forms: the plain one, and the form that
takes it (``"form": "seg"`` in its cases, files
``<op>_<impl>_<form>_<dir>_<i>.mlir``). With ``--bench`` the shapes are the
contract's ``bench_shapes`` (``strata kernels bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp

from . import kernels as K


def _per_input(shape: list[Any]) -> bool:
    return bool(shape) and isinstance(shape[0], list)


def _required(op: dict[str, Any]) -> list[dict[str, Any]]:
    return [spec for spec in op["inputs"] if not spec.get("optional")]


def _forms(op: dict[str, Any]) -> list[dict[str, Any] | None]:
    """The forms verified: the plain one (None), then one per optional input
    (attention's segment_ids, form "seg"), which adds that input."""
    return [None] + [spec for spec in op["inputs"] if spec.get("optional")]


def _dim_names(rule: str) -> list[str]:
    """ "[B, T, H, Dh]" -> ["B", "T", "H", "Dh"]; [] for a rule with "..." or
    "like <input>". """
    if not rule.startswith("[") or "..." in rule:
        return []
    return [d.strip() for d in rule[1:-1].split(",")]


def _shapes(op: dict[str, Any], shape: list[Any], form: dict[str, Any] | None = None) -> list[tuple[int, ...]]:
    """The op's input shapes for one verify shape. A flat shape is the first
    input's, the others derived from it (``[D]``: its last dim; anything
    else: the same). A list of shapes (attention's ``[q, k]``) gives the
    inputs in order, skipping those whose shape is ``like <input>``, which
    copy that input's. Optional inputs are left out, but for |form|'s, whose
    dims are named by the other inputs' rules (segment_ids ``[B, T]``: q's
    first two), appended last."""
    out: list[tuple[int, ...]] = []
    required = _required(op)
    if _per_input(shape):
        given = iter(shape)
        named: dict[str, tuple[int, ...]] = {}
        for spec in required:
            like = spec["shape"][5:] if spec["shape"].startswith("like ") else None
            named[spec["name"]] = named[like] if like else tuple(next(given))
            out.append(named[spec["name"]])
    else:
        for spec in required:
            if spec["shape"] == "[D]":
                out.append((shape[-1],))
            elif spec["shape"] == "[N]":  # per row of an [N, V] first input (cross_entropy's targets)
                out.append((shape[0],))
            else:
                out.append(tuple(shape))
    if form is not None:
        dims: dict[str, int] = {}
        for spec, s in zip(required, out):
            dims.update({n: d for n, d in zip(_dim_names(spec["shape"]), s) if n not in dims})
        out.append(tuple(dims[n] for n in _dim_names(form["shape"])))
    return out


def _dtypes(op: dict[str, Any], form: dict[str, Any] | None = None) -> list[str]:
    """Each input's dtype in the verify programs: the contract's first."""
    specs = _required(op) + ([form] if form is not None else [])
    return [spec["dtypes"][0] for spec in specs]


def _programs(op: dict[str, Any], impl: str, shape: list[Any],
              form: dict[str, Any] | None = None) -> dict[str, tuple[Any, list[tuple[int, ...]]]]:
    fn = K.IMPLEMENTATIONS[op["name"]][impl]
    ins = _shapes(op, shape, form)
    floats = [i for i, d in enumerate(_dtypes(op, form)) if d == "f32"]

    # Every output of the contract's forward (attention's o and lse), where
    # the differentiable op returns fewer.
    contract_fwd = K.CONTRACT_FWD.get(op["name"], {}).get(impl, fn)

    def fwd(*args):  # type: ignore[no-untyped-def]
        return contract_fwd(*args)

    def bwd(*args):  # type: ignore[no-untyped-def]
        # The gradients of the float inputs only (integer targets have none).
        primals, ct = list(args[:-1]), args[-1]

        def f(*fl):  # type: ignore[no-untyped-def]
            full = list(primals)
            for i, v in zip(floats, fl):
                full[i] = v
            return fn(*full)

        _, vjp = jax.vjp(f, *[primals[i] for i in floats])
        return vjp(ct)

    # The cotangent of the first output: [N] for a per-row output (cross_entropy's ce), else like the first input.
    out_shape = (ins[0][0],) if op["outputs"][0]["shape"] == "[N]" else ins[0]
    return {"fwd": (fwd, ins), "bwd": (bwd, ins + [out_shape])}


def _cases(outdir: str, op: dict[str, Any], impl: str, si: int, shape: list[Any],
           form: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The fwd and bwd cases of one (implementation, shape, form), their
    programs written. A form's cases say so ("form": "seg") and name their
    files <op>_<impl>_<form>_<dir>_<i>, its ffi target's key (seg_fwd)."""
    tol = op["tolerance"]["f32"]
    cases = []
    for d, (fn, ins) in _programs(op, impl, shape, form).items():
        if d == "bwd" and not op["has_backward"]:
            continue
        dts = _dtypes(op, form) + (["f32"] if d == "bwd" else [])
        specs = [jax.ShapeDtypeStruct(s, jnp.int32 if dt == "s32" else jnp.float32) for s, dt in zip(ins, dts)]
        lowered = jax.jit(fn).lower(*specs)
        outs = jax.tree_util.tree_leaves(lowered.out_info)
        name = f"{op['name']}_{impl}_{d}_{si}" if form is None else f"{op['name']}_{impl}_{form['form']}_{d}_{si}"
        rel = f"programs/{name}.mlir"
        with open(os.path.join(outdir, rel), "w", encoding="utf-8") as f:
            f.write(lowered.as_text())
        names = [s["name"] for s in _required(op)] + ([form["name"]] if form is not None else [])
        kinds = names + (["d" + op["outputs"][0]["name"]] if d == "bwd" else [])
        case = {"op": op["name"], "impl": impl, "dir": d, "shape": list(shape), "file": rel,
                "inputs": [list(s) for s in ins], "outputs": [list(o.shape) for o in outs],
                "input_kinds": kinds, "input_dtypes": dts, "rtol": tol[d]["rtol"], "atol": tol[d]["atol"]}
        if form is not None:
            case["form"] = form["form"]
        cases.append(case)
    return cases


def export(outdir: str, only: str | None = None, bench: bool = False, impl: str | None = None) -> dict[str, Any]:
    only_impl = impl
    os.makedirs(os.path.join(outdir, "programs"), exist_ok=True)
    cases = []
    for op in K.CONTRACT["ops"]:
        if only and op["name"] != only:
            continue
        for si, shape in enumerate(op["bench_shapes" if bench else "verify_shapes"]):
            for impl in op["implementations"]:
                if bench and impl == "pallas":
                    continue  # interpret mode on CPU: not timed (strata kernels bench)
                if only_impl and impl not in ("xla", only_impl):
                    continue  # --impl: that implementation and the xla reference
                for form in _forms(op):
                    cases += _cases(outdir, op, impl, si, shape, form)
    index = {"contract_version": K.CONTRACT["contract_version"], "cases": cases}
    with open(os.path.join(outdir, "index.json"), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=1)
    return index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata_jax.kernel_verify", description=__doc__.strip().splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--op", default=None)
    ap.add_argument("--bench", action="store_true", help="the contract's bench_shapes instead of verify_shapes")
    ap.add_argument("--impl", default=None, choices=("ffi", "pallas"),
                    help="only this implementation (and the xla reference)")
    args = ap.parse_args(argv)
    if args.op and args.op not in K.OPS:
        print(f"strata_jax.kernel_verify: --op {args.op}: no such kernel op (the contract has: "
              f"{', '.join(sorted(K.OPS))})", file=sys.stderr)
        return 2
    jax.config.update("jax_platforms", "cpu")
    export(args.outdir, args.op, args.bench, args.impl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
