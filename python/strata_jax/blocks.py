"""The built-in block kinds, registered in one place (docs/model.md, "Block kinds").

The registry (registry.py) holds what a kind is and the kinds registered;
this module defines llama's and the parallel block's kinds and registers
every built-in kind, in this order: llama, parallel, moe (moe.py), gpt2
(gpt2.py). model.py imports it, so that the whole model (and every module
above it: programs, the exporter, the reference) knows them all. A new
kind: its module builds a `BlockKind` (its maths from layers.py and
llama.py), and one line below registers it.
"""

from __future__ import annotations

import jax

from . import gpt2
from . import layers as L
from . import llama
from . import moe
from .config import ModelConfig
from .layers import Params
from .registry import KINDS, BlockKind, kind_of_group, kinds_of, register  # noqa: F401  (blocks.<name>, as before)

Array = jax.Array


# --- llama: RMSNorm, RoPE attention (grouped-query with n_kv_heads), SwiGLU -------

LLAMA = BlockKind(
    name="llama", group="block", prefix="block",
    params=lambda cfg: L.BLOCK_PARAMS, init=L.init_block, fwd=L.block_fwd,
    fwd_res=llama.block_fwd_res, bwd_res=llama.block_bwd_res, residuals=llama.residuals,
    prefill=llama.block_prefill, decode=llama.block_decode,
    doc="x += attn(rmsnorm(x)); x += swiglu(rmsnorm(x))")


# --- parallel: one norm, attention and MLP side by side (GPT-J, PaLM) --------------

PARALLEL_PARAMS: tuple[str, ...] = ("attn_norm", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def parallel_init(cfg: ModelConfig, seed: Array, layer: Array, n_layers: Array) -> Params:
    return llama.init_matrices(cfg, PARALLEL, seed, layer, n_layers, L.BLOCK_MATRICES, L.RESIDUAL_OUT)


def parallel_fwd(cfg: ModelConfig, p: Params, x: Array) -> Array:
    h = L.norm(cfg, x, p["attn_norm"])
    return x + L.attention(cfg, p, h) + L.mlp(cfg, p, h)


def parallel_prefill(cfg: ModelConfig, p: Params, x: Array) -> tuple[Array, Array, Array]:
    _, k, v = llama._qkv(cfg, p, x)
    return parallel_fwd(cfg, p, x), k, v


def parallel_decode(cfg: ModelConfig, p: Params, x: Array, k_cache: Array, v_cache: Array,
                    pos: Array) -> tuple[Array, Array, Array]:
    h = L.norm(cfg, x, p["attn_norm"])
    a, k_cache, v_cache = llama.attention_decode(cfg, p, h, k_cache, v_cache, pos)
    return x + a + L.mlp(cfg, p, h), k_cache, v_cache


PARALLEL = BlockKind(
    name="parallel", params=lambda cfg: PARALLEL_PARAMS, init=parallel_init, fwd=parallel_fwd,
    prefill=parallel_prefill, decode=parallel_decode,
    doc="h = rmsnorm(x); x += attn(h) + swiglu(h)")


for _kind in (LLAMA, PARALLEL, moe.KIND, gpt2.KIND):
    register(_kind)
