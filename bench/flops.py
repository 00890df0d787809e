"""Model FLOPs of one training step, for MFU (docs/performance.md).

The usual MFU convention: the FLOPs the *model* needs, not what an
implementation executes, so recomputation (strata's block_bwd runs the
block forward again) and the optimizer are not counted. A multiply-add is
2 FLOPs; backward = 2 x forward; attention scores and values are counted
over the full T x T square (XLA computes the masked half as well).
"""

from __future__ import annotations

from typing import Any, Mapping


def layer_matrix_elements(m: Mapping[str, Any], kind: str) -> int:
    """Elements of one layer's matrices (what src/train/mfu.c sums from the
    parameter table: rank-2 tensors, a rank-3 stack of experts as one expert)."""
    D, F, H = int(m["d_model"]), int(m["d_ff"]), int(m.get("n_heads", 1))
    kv = int(m.get("n_kv_heads") or 0) or H
    attn = 2 * D * D + 2 * D * (D // H) * kv  # wq, wo; wk, wv (grouped-query: kv heads)
    if kind == "gpt2":
        return attn + 2 * D * F  # w_fc, w_proj
    if kind == "moe":
        return attn + D * int(m.get("n_experts", 8)) + 3 * D * F  # router; one expert's SwiGLU
    return attn + 3 * D * F  # llama, parallel: w_gate, w_up, w_down


def forward_flops_per_token(m: Mapping[str, Any]) -> int:
    D, T, V, L = (int(m[k]) for k in ("d_model", "seq_len", "vocab_size", "n_layers"))
    kinds = list(m.get("layers") or []) or [m.get("block") or "llama"] * L
    matmuls = sum(2 * layer_matrix_elements(m, k) for k in kinds)
    return matmuls + L * 2 * 2 * T * D + 2 * D * V  # + QK^T and PV, + the output projection (tied or not)


def step_flops(config: Mapping[str, Any]) -> int:
    """Model FLOPs of one optimizer step: 3 x forward over batch_size x seq_len tokens."""
    m, t = config["model"], config["train"]
    tokens = int(t["batch_size"]) * int(m["seq_len"])
    return 3 * tokens * forward_flops_per_token(m)
