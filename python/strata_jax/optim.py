"""AdamW, gradient clipping and the LR schedule (docs/model.md, "Step semantics").

`adamw_update` is the body of the exported `adamw_<group>` programs and is
also what the reference applies, so both do the same arithmetic.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp

Array = jax.Array


def adamw_update(params: Sequence[Array], grads: Sequence[Array], m: Sequence[Array],
                 v: Sequence[Array], decay: Sequence[bool], step: Array, lr: Array,
                 gscale: Array, hyper: Array) -> tuple[list[Array], list[Array], list[Array]]:
    """One AdamW step for a group. hyper = [beta1, beta2, eps, weight_decay] (f32[4])."""
    b1, b2, eps, wd = hyper[0], hyper[1], hyper[2], hyper[3]
    bc1 = 1.0 - jnp.power(b1, step)
    bc2 = 1.0 - jnp.power(b2, step)
    new_p: list[Array] = []
    new_m: list[Array] = []
    new_v: list[Array] = []
    for p, g, mi, vi, dec in zip(params, grads, m, v, decay, strict=True):
        g = g * gscale
        mi = b1 * mi + (1.0 - b1) * g
        vi = b2 * vi + (1.0 - b2) * (g * g)
        upd = (mi / bc1) / (jnp.sqrt(vi / bc2) + eps)
        if dec:
            upd = upd + wd * p
        new_p.append(p - lr * upd)
        new_m.append(mi)
        new_v.append(vi)
    return new_p, new_m, new_v


def sqnorm(grads: Sequence[Array]) -> Array:
    """Sum of squares of all the arrays, f32 scalar (body of `sqnorm_<group>`)."""
    total = jnp.float32(0.0)
    for g in grads:
        g = g.astype(jnp.float32)
        total = total + jnp.sum(g * g)
    return total


def lr_at(t: int, *, lr: float, min_lr_ratio: float, warmup_steps: int, steps: int) -> float:
    """Learning rate of optimizer step t (1-based), float64 on host."""
    if t <= warmup_steps:
        return lr * t / warmup_steps
    p = (t - warmup_steps) / max(1, steps - warmup_steps)
    min_lr = lr * min_lr_ratio
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


def clip_scale(norm: float, grad_clip: float) -> float:
    """min(1, grad_clip / (norm + 1e-6)), or 1 when grad_clip is 0."""
    return min(1.0, grad_clip / (norm + 1e-6)) if grad_clip > 0 else 1.0
