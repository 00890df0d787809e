"""Model FLOPs of one training step, for MFU (docs/performance.md).

The usual MFU convention: the FLOPs the *model* needs, not what an
implementation executes, so recomputation (strata's block_bwd runs the
block forward again) and the optimizer are not counted. A multiply-add is
2 FLOPs; backward = 2 x forward; attention scores and values are counted
over the full T x T square (XLA computes the masked half as well).
"""

from __future__ import annotations

from typing import Any, Mapping


def forward_flops_per_token(m: Mapping[str, Any]) -> int:
    D, F, T, V, L = (int(m[k]) for k in ("d_model", "d_ff", "seq_len", "vocab_size", "n_layers"))
    per_layer = 2 * (4 * D * D + 3 * D * F) + 2 * 2 * T * D  # projections + MLP, QK^T and PV
    return L * per_layer + 2 * D * V  # + the output projection (tied or not)


def step_flops(config: Mapping[str, Any]) -> int:
    """Model FLOPs of one optimizer step: 3 x forward over batch_size x seq_len tokens."""
    m, t = config["model"], config["train"]
    tokens = int(t["batch_size"]) * int(m["seq_len"])
    return 3 * tokens * forward_flops_per_token(m)
