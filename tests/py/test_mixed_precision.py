"""model.compute_dtype=bf16 (docs/model.md, "Mixed precision"): what is bf16
in the bundle's programs and what stays f32."""

from __future__ import annotations

import re

import jax
import pytest

from conftest import tiny_model
from strata_jax import programs as P
from strata_jax.model import ModelConfig

DOT = re.compile(r"stablehlo\.dot_general.*: \(tensor<[0-9x]*x(\w+)>, tensor<[0-9x]*x(\w+)>\) -> tensor<[0-9x]*x(\w+)>")


def _dots(prog: P.Program) -> list[tuple[str, str, str]]:
    text = jax.jit(prog.fn, keep_unused=True).lower(*[s.struct() for s in prog.inputs]).as_text()
    return [m.groups() for line in text.splitlines() if (m := DOT.search(line))]


@pytest.mark.parametrize("dtype,tied", [("bf16", True), ("bf16", False), ("f32", True)])
def test_every_matmul_takes_compute_dtype_operands(dtype: str, tied: bool) -> None:
    """bf16: the forward's and the backward's matmuls alike take bf16 operands
    and accumulate in f32 (JAX's own transpose of a bf16 dot with an f32
    result ran the backward's in f32). f32: all f32."""
    cfg = ModelConfig.from_dict(tiny_model(compute_dtype=dtype, tie_embeddings=tied))
    operand = "bf16" if dtype == "bf16" else "f32"
    seen = {}
    for prog in P.build_programs(cfg):
        dots = _dots(prog)
        seen[prog.name] = len(dots)
        for a, b, out in dots:
            assert (a, b, out) == (operand, operand, "f32"), f"{prog.name}: a {a} x {b} -> {out} dot"
    for name in ("block_fwd", "block_bwd", "block_fwd_res", "block_bwd_res", "head_loss"):
        assert seen[name] > 0, name


def test_state_and_loss_stay_f32() -> None:
    """Master weights, gradients, optimizer moments and the loss are f32 in a bf16 bundle."""
    cfg = ModelConfig.from_dict(tiny_model(compute_dtype="bf16"))
    roles = {"param", "grad", "opt_m", "opt_v", "loss", "metric", "logits", "activation", "activation_grad"}
    checked = 0
    for prog in P.build_programs(cfg):
        for s in prog.inputs + prog.outputs:
            if s.role in roles:
                assert s.dtype == "f32", f"{prog.name}: {s.name} ({s.role}) is {s.dtype}"
                checked += 1
    assert checked > 100
