"""Tolerances derived from the computation, not tuned on one CPU.

Two evaluations of the same mathematics in floating point (a residual-keeping
backward against a recomputing one; strata's per-layer programs against one
jax.jit; AVX-512 against AVX2 code generation) differ only by rounding, and
rounding has a bound that depends on the computation, not on the machine:
summing n terms in any order, with or without fused multiply-adds, errs by at
most gamma(n) * sum|terms|, gamma(n) = n u / (1 - n u), u the unit roundoff
of the dtype (Higham, "Accuracy and Stability of Numerical Algorithms", §3.1;
it holds for every summation order, so for every instruction set). Two such
evaluations differ by at most twice that.

The helpers here state a comparison's bound from three things the test knows:
the dtype, the reduction length n (the sum of the contraction lengths along the
longest chain of sums that produce the value: a chain of sums is one sum of
their total length for this bound), and the scale of the summed magnitudes
(how large the terms that meet in those sums are). Elements that nearly cancel
(a key bias's gradient is exactly zero in exact arithmetic: softmax is
invariant to it) are bounded by that scale, not by their own tiny value, which
is why a per-element relative tolerance alone cannot work and why the scale is
a property of the computation, not of the output element.

tests/README.md ("Tolerances") says how each numeric test picks its n and scale;
`make test-long` runs the numeric tests again under XLA_FLAGS=--xla_cpu_max_isa
=AVX2 and =SSE4_2 to check the bounds hold for other code generation.
"""
from __future__ import annotations

from typing import Any

import numpy as np

# Unit roundoff: half the distance from 1 to the next number.
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float64": 2.0 ** -53}


def gamma(n: int, dtype: str = "float32") -> float:
    """Higham's gamma_n: the relative error bound of a sum or dot product of n terms."""
    nu = n * UNIT_ROUNDOFF[dtype]
    assert nu < 0.5, f"a reduction of {n} terms in {dtype} has no useful worst-case bound"
    return nu / (1.0 - nu)


def rounding_bound(n: int, scale: float, dtype: str = "float32", evaluations: int = 2) -> float:
    """The largest difference rounding allows between |evaluations| evaluations'
    results (2: two computations each off by gamma(n) * scale)."""
    return evaluations * gamma(n, dtype) * scale


def rms(x: Any) -> float:
    a = np.asarray(x, dtype=np.float64)
    return float(np.sqrt(np.mean(a * a))) if a.size else 0.0


def assert_rounding_close(got: Any, want: Any, *, n: int, scale: float, dtype: str = "float32",
                          evaluations: int = 2, what: str = "") -> None:
    """Every element: |got - want| <= evaluations * gamma(n) * max(scale, |want|).

    |want| itself bounds the summed magnitudes of a non-cancelling element from
    below; |scale| bounds them for one that cancels. Fails naming the worst
    element, its difference and the bound."""
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    assert g.shape == w.shape, (what, g.shape, w.shape)
    bound = evaluations * gamma(n, dtype) * np.maximum(scale, np.abs(w))
    diff = np.abs(g - w)
    if not np.all(np.isfinite(g)) or not np.all(np.isfinite(w)):
        raise AssertionError(f"{what}: non-finite values")
    over = diff > bound
    if over.any():
        i = np.unravel_index(int(np.argmax(diff - bound)), diff.shape)
        raise AssertionError(
            f"{what}: {int(over.sum())} of {diff.size} elements differ beyond rounding; worst at {i}: "
            f"{g[i]!r} vs {w[i]!r}, |diff| {diff[i]:.3g} > bound {bound[i]:.3g} "
            f"({evaluations} x gamma({n}, {dtype}) x max(scale {scale:.3g}, |want|))")


def assert_all_rounding_close(got: Any, want: Any, *, n: int, dtype: str = "float32", what: str = "") -> None:
    """assert_rounding_close over matching leaves of two pytrees (a program's
    outputs, a gradient dict), the scale of the summed magnitudes taken as the
    largest RMS among |want|'s leaves: the terms that meet in one output's sums
    are other outputs' sizes (a bias gradient that is 0 in exact arithmetic is
    the sum of terms the size of the other gradients)."""
    import jax

    g_leaves, w_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(g_leaves) == len(w_leaves), (what, len(g_leaves), len(w_leaves))
    scale = max((rms(w) for w in w_leaves), default=0.0)
    for i, (g, w) in enumerate(zip(g_leaves, w_leaves)):
        assert_rounding_close(g, w, n=n, scale=scale, dtype=dtype, what=f"{what} [{i}]")
