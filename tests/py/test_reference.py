"""Data sampler, schedule, the monolithic reference, and its equivalence with a
layer-by-layer run of the exported program texts (what the C trainer does)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, tiny_config

from strata_jax import data as D
from strata_jax import export as E
from strata_jax import model as M
from strata_jax.model import ModelConfig
from strata_jax.optim import clip_scale, lr_at
from strata_jax.reference_train import TrainConfig, load_config, train


def test_splitmix64_and_window_start() -> None:
    assert D.splitmix64(0) == 0xE220A8397B1DCDAF  # the reference splitmix64 output for state 0
    assert D.splitmix64(D.MASK64) < 1 << 64
    a = [D.window_start(42, 0, i, 1000, 16) for i in range(50)]
    assert all(0 <= s < 984 for s in a) and len(set(a)) > 40
    assert a != [D.window_start(42, 1, i, 1000, 16) for i in range(50)]
    assert a != [D.window_start(43, 0, i, 1000, 16) for i in range(50)]
    # wrapping arithmetic: seed ^ (stream << 32), all in u64
    s = (7 ^ (1 << 32))
    assert D.window_start(7, 1, 5, 1000, 16) == D.splitmix64(D.splitmix64(s) ^ 5) % 984
    assert D.window_start(-1, 0, 0, 1000, 16) == D.splitmix64(D.splitmix64(D.MASK64)) % 984


def test_token_file_roundtrip_and_errors(tmp_path: Any) -> None:
    toks = D.synthetic_tokens(256)
    assert len(toks) == 65536 and toks[97] == 3 and toks[96] == 96
    p = str(tmp_path / "a.tok")
    D.write_token_file(p, toks, 256)
    assert os.path.getsize(p) == 48 + 2 * 65536  # version 2 (docs/data.md)
    back, vocab = D.read_token_file(p)
    assert vocab == 256 and np.array_equal(back, toks) and D.token_file_tokenizer(p) == "byte"
    raw = open(p, "rb").read()
    for name, blob in (("magic", b"X" + raw[1:]), ("short", raw[:-1]),
                       ("vocab", raw[:12] + (10).to_bytes(4, "little") + raw[16:])):
        q = str(tmp_path / f"{name}.tok")
        open(q, "wb").write(blob)
        with pytest.raises(D.DataError, match=q.replace(".", r"\.")):
            D.read_token_file(q)


def test_sampler_batches() -> None:
    toks = np.arange(1000) % 50
    s = D.Sampler(toks, seed=9, val_fraction=0.25, seq_len=8, batch_size=6, microbatches=3)
    assert len(s.train) == 750 and len(s.val) == 250
    b = s.batch(2)
    assert b.tokens.shape == (3, 2, 8) and b.tokens.dtype == np.int32 and b.mask.dtype == np.float32
    start = D.window_start(9, 0, 2 * 6 + 1 * 2 + 1, 750, 8)  # microbatch 1, row 1 of step 2
    np.testing.assert_array_equal(b.tokens[1, 1], toks[start:start + 8])
    np.testing.assert_array_equal(b.targets[1, 1], toks[start + 1:start + 9])
    e = s.eval_batch(2)
    assert e.tokens.shape == (6, 2, 8)
    start = D.window_start(9, 1, 0, 250, 8)
    np.testing.assert_array_equal(e.tokens[0, 0], toks[750 + start:750 + start + 8])
    with pytest.raises(D.DataError):
        D.Sampler(toks[:20], seed=0, val_fraction=0.5, seq_len=16, batch_size=2, microbatches=1)


def test_lr_schedule_and_clip() -> None:
    kw = dict(lr=1.0, min_lr_ratio=0.1, warmup_steps=4, steps=14)
    assert [lr_at(t, **kw) for t in (1, 2, 4)] == [0.25, 0.5, 1.0]
    assert lr_at(9, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(14, **kw) == pytest.approx(0.1)
    assert lr_at(1, lr=1.0, min_lr_ratio=0.0, warmup_steps=0, steps=1) == pytest.approx(0.0)
    assert clip_scale(2.0, 0.0) == 1.0 and clip_scale(0.5, 1.0) == 1.0
    assert clip_scale(4.0, 1.0) == pytest.approx(0.25)


def test_reference_cli_loss_decreases(tmp_path: Any) -> None:
    tok = str(tmp_path / "syn.tok")
    D.write_token_file(tok, D.synthetic_tokens(64), 64)
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(tiny_config(steps=100)))
    out = tmp_path / "ref"
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    r = subprocess.run([sys.executable, "-m", "strata_jax.reference_train", "--config-json", str(cfg_path),
                        "--tokens", tok, "--out", str(out), "--steps", "30", "--quiet"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    hist = json.loads((out / "losses.json").read_text())
    losses = hist["losses"]
    assert len(losses) == 30 and all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(math.log(64), abs=0.05)
    assert np.mean(losses[-5:]) < losses[0] - 0.5
    assert [s for s, _ in hist["eval_losses"]] == [10, 20, 30]
    assert hist["eval_losses"][-1][1] < hist["eval_losses"][0][1]
    assert len(hist["grad_norms"]) == len(hist["lrs"]) == 30
    from safetensors.numpy import load_file
    params = load_file(str(out / "params.safetensors"))
    cfg = ModelConfig.from_dict(load_config(str(cfg_path))["model"])
    assert sorted(params) == sorted(M.flat_param_names(cfg))
    assert params["layers.1.w_down"].shape == (64, 32)


def layerwise_train(run: Any, config: dict[str, Any], tokens: np.ndarray, steps: int
                    ) -> tuple[dict[str, np.ndarray], list[float], list[float]]:
    """The C trainer's step semantics (docs/model.md), driven through the bundle programs."""
    cfg = ModelConfig.from_dict(config["model"])
    tc = TrainConfig.from_dict(config["train"])
    n_micro, tied, nl = tc.microbatches, cfg.tie_embeddings, cfg.n_layers
    sampler = D.Sampler(tokens, seed=config["seed"], val_fraction=config["data"]["val_fraction"],
                        seq_len=cfg.seq_len, batch_size=tc.batch_size, microbatches=n_micro)
    seed = np.int32(config["seed"])
    groups: list[tuple[str, list[np.ndarray]]] = [("embed", run("embed_init", seed))]
    groups += [("block", run("block_init", seed, np.int32(i), np.int32(nl))) for i in range(nl)]
    groups.append(("head", run("head_init", seed)))
    m = [[np.zeros_like(p) for p in ps] for _, ps in groups]
    v = [[np.zeros_like(p) for p in ps] for _, ps in groups]
    losses, norms = [], []
    for k in range(steps):
        b = sampler.batch(k)
        acc: list[list[np.ndarray]] | None = None
        step_losses = []
        for mi in range(n_micro):
            wte = groups[0][1][0]
            xs = [run("embed_fwd", wte, b.tokens[mi])[0]]
            for i in range(nl):
                xs.append(run("block_fwd", *groups[1 + i][1], xs[-1])[0])
            out = run("head_loss", *groups[-1][1], *([wte] if tied else []), xs[-1], b.targets[mi], b.mask[mi])
            nh = len(groups[-1][1])
            step_losses.append(float(out[0]))
            head_g, dx = out[1:1 + nh], out[-1]
            grads: list[list[np.ndarray]] = [[]] * (nl + 2)
            grads[-1] = head_g
            for i in reversed(range(nl)):
                *g, dx = run("block_bwd", *groups[1 + i][1], xs[i], dx)
                grads[1 + i] = g
            dwte = run("embed_bwd", wte, b.tokens[mi], dx)
            grads[0] = run("accum_embed", dwte[0], out[1 + nh]) if tied else dwte
            acc = grads if acc is None else [run(f"accum_{groups[j][0]}", *acc[j], *grads[j])
                                             for j in range(len(groups))]
        assert acc is not None
        sq = sum(float(run(f"sqnorm_{groups[j][0]}", *acc[j])[0]) for j in range(len(groups)))
        norm = math.sqrt(sq) / n_micro
        gscale = np.float32(clip_scale(norm, tc.grad_clip) / n_micro)
        lr = np.float32(lr_at(k + 1, lr=tc.lr, min_lr_ratio=tc.min_lr_ratio,
                              warmup_steps=tc.warmup_steps, steps=tc.steps))
        for j, (g, ps) in enumerate(groups):
            n = len(ps)
            out = run(f"adamw_{g}", *ps, *acc[j], *m[j], *v[j], np.float32(k + 1), lr, gscale, tc.hyper)
            groups[j] = (g, out[:n])
            m[j], v[j] = out[n:2 * n], out[2 * n:]
        losses.append(sum(step_losses) / n_micro)
        norms.append(norm)
    names = M.flat_param_names(cfg)
    flat = [p for _, ps in groups for p in ps]
    return dict(zip(names, flat)), losses, norms


# untied (clipping off) is a long drill (make test-long): the tied case keeps
# the layer-by-layer run in make test, and the untied programs' gradients are
# checked against the full model's in test_model.py (chained programs, [False-f32]).
@pytest.mark.parametrize("tied", [True, pytest.param(False, marks=pytest.mark.long)])
def test_layerwise_programs_match_reference(tmp_path: Any, mlir_runner_factory: Any, tied: bool) -> None:
    config = tiny_config(steps=6, tie_embeddings=tied, init_std=0.1)
    config["train"]["grad_clip"] = 0.5 if tied else 0.0  # clipping active / off
    config = load_config(json.dumps(config))
    cfg = ModelConfig.from_dict(config["model"])
    manifest = E.export_bundle(cfg, str(tmp_path / "bundle"))
    run = mlir_runner_factory(str(tmp_path / "bundle"), manifest)
    tokens = D.synthetic_tokens(cfg.vocab_size, 4096)

    params, losses, norms = layerwise_train(run, config, tokens, steps=6)
    ref_params, hist = train(config, tokens)

    if tied:
        assert any(n > 0.5 for n in norms)  # the clip was exercised
    np.testing.assert_allclose(losses, hist["losses"], rtol=2e-5)
    np.testing.assert_allclose(norms, hist["grad_norms"], rtol=1e-4)
    ref_flat = M.flatten_params(ref_params)
    assert sorted(ref_flat) == sorted(params)
    for name, p in params.items():
        np.testing.assert_allclose(p, ref_flat[name], rtol=1e-4, atol=3e-5, err_msg=name)
