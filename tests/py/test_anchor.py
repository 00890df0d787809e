"""The benchmark anchors (strata_jax/anchor.py) train the same model as the
reference: a benchmark against a different computation would be meaningless."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, tiny_config

from strata_jax import anchor as A
from strata_jax import data as D
from strata_jax import model as M
from strata_jax.model import ModelConfig
from strata_jax.reference_train import load_config, train


# untied is a long drill: the tied case runs every variant, the untied one
# only scan (the weight layout that differs).
@pytest.mark.parametrize("tied", [True, pytest.param(False, marks=pytest.mark.long)])
def test_anchor_variants_match_reference(tied: bool) -> None:
    config = load_config(json.dumps(tiny_config(steps=4, n_layers=3, tie_embeddings=tied, init_std=0.1)))
    config["train"]["grad_clip"] = 0.5  # below the early norms: the clip path is exercised
    tokens = D.synthetic_tokens(64, 4096)
    _, hist = train(config, tokens)
    # unroll *is* reference_train.make_train_step: one weight layout is enough for it.
    for variant in A.VARIANTS if tied else ("scan",):
        r = A.run(config, tokens, variant)
        assert r["variant"] == variant and r["steps"] == 4 and len(r["step_time_s"]) == 4
        assert r["compile_s"] > 0 and r["lower_s"] > 0 and r["peak_rss_bytes"] > 0
        # The first step is bit-for-bit the same math; later steps differ only
        # by fusion-dependent rounding amplified through Adam.
        np.testing.assert_allclose(r["losses"], hist["losses"], rtol=2e-5, err_msg=variant)


def test_stack_unstack_roundtrip() -> None:
    cfg = ModelConfig.from_dict({**tiny_config()["model"], "n_layers": 3})
    p = M.init_params(cfg, 3)
    s = A.stack_blocks(p)
    assert s["blocks"]["wq"].shape == (3, cfg.d_model, cfg.d_model)
    back = A.unstack_blocks(s, 3)
    for i in range(3):
        for k in M.BLOCK_PARAMS:
            np.testing.assert_array_equal(back["blocks"][i][k], p["blocks"][i][k])


def test_anchor_cli_compile_only_and_errors(tmp_path: Any) -> None:
    tok = str(tmp_path / "syn.tok")
    D.write_token_file(tok, D.synthetic_tokens(64), 64)
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(tiny_config(steps=3)))
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "strata_jax.anchor", "--config-json", str(cfg_path), "--tokens", tok]
    r = subprocess.run([*cmd, "--variant", "scan", "--compile-only", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["variant"] == "scan" and res["steps"] == 0 and res["step_time_s"] == []
    assert res["compile_s"] > 0 and res["n_layers"] == 2
    # Missing token file: a data/config error naming the file, nothing written.
    out2 = tmp_path / "r2.json"
    r = subprocess.run([sys.executable, "-m", "strata_jax.anchor", "--config-json", str(cfg_path),
                        "--tokens", str(tmp_path / "nope.tok"), "--variant", "unroll", "--out", str(out2)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "nope.tok" in r.stderr and not out2.exists()


@pytest.mark.long
def test_anchor_knows_every_block_kind() -> None:
    """scan on a stack of one kind (parallel, GQA), unroll and unroll_remat
    on a mixed stack: the same losses as the reference; scan refuses a mixed
    stack (it stacks one kind's parameters)."""
    for model, variants in (({"block": "parallel", "n_kv_heads": 1}, ("scan",)),
                            ({"layers": ["llama", "parallel", "llama"], "n_kv_heads": 1}, ("unroll", "unroll_remat"))):
        base = tiny_config(steps=3, n_layers=3, init_std=0.1)
        base["model"]["n_heads"] = 2
        base["model"].update(model)
        config = load_config(json.dumps(base))
        tokens = D.synthetic_tokens(64, 4096)
        _, hist = train(config, tokens)
        for variant in variants:
            r = A.run(config, tokens, variant)
            np.testing.assert_allclose(r["losses"], hist["losses"], rtol=2e-5, err_msg=f"{model} {variant}")
    with pytest.raises(ValueError, match="scan variant needs one block kind"):
        A.run(config, tokens, "scan")
