"""The gpt2 block kind and family (docs/model.md, "Block kinds", gpt2 and
"Families"), and the padded vocabulary (model.vocab_padded).

- the C trainer on a gpt2 stack with a padded vocabulary, 20 steps against
  the monolithic reference, every loss within rtol 1e-4 (f32); the padding
  rows of wte stay exactly zero in both (they would not if the padding
  logits reached the loss);
- the block's forward against an independent numpy float64 GPT-2 block
  (LayerNorm with biases, GELU's tanh formula written out, no RoPE);
- the family's embedding (learned positions) and head (LayerNorm with bias);
- the padding ids' logits are masked out of head_loss (loss and gradient)
  and cut from head_logits, tied and untied;
- kinds of two families in one stack are refused.
The finite-difference check of the block's backward, the layer-count
independence and the bad-config exits are test_kinds.py's (parametrized
over the kinds, gpt2 included); greedy sampling is test_sample.py's.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python"))

from strata_jax import gpt2 as G  # noqa: E402
from strata_jax import model as M  # noqa: E402
from strata_jax import programs as PR  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")
ENV = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python"), "JAX_PLATFORMS": "cpu"}

BASE = dict(vocab_size=60, d_model=32, n_layers=2, n_heads=4, d_ff=48, seq_len=8, tie_embeddings=True,
            compute_dtype="f32", rope_theta=10000.0, init_std=0.02, microbatch_size=2, block="gpt2")


def cfg_of(**kw: Any) -> M.ModelConfig:
    return M.ModelConfig(**{**BASE, **kw})


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=ENV)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


# --- equivalence with the reference ------------------------------------------------

EQUIV = ["model.block=gpt2", "model.n_layers=2", "model.d_model=32", "model.n_heads=4", "model.d_ff=64",
         "model.seq_len=16", "model.vocab_size=250", "model.vocab_padded=320",
         "train.steps=20", "train.batch_size=4", "train.microbatches=2", "train.lr=0.002", "train.warmup_steps=5",
         "train.grad_clip=0.5", "train.eval_every=10", "train.eval_batches=1", "data.synthetic=true",
         "runtime.deterministic=true", "seed=3", "sched.remat=0"]  # layer 0 recomputes, layer 1 keeps its residuals


def test_gpt2_matches_reference(tmp_path: Any) -> None:
    from safetensors.numpy import load_file

    if not os.path.exists(STRATA):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    run([STRATA, "train", "configs/test.yml", *EQUIV, f"run.dir={tmp_path / 'run'}"])
    (tmp_path / "config.json").write_text(run([STRATA, "config", "--json", "configs/test.yml", *EQUIV]).stdout)
    tokens = run([STRATA, "data", "configs/test.yml", *EQUIV]).stdout.splitlines()[0]
    run([sys.executable, "-m", "strata_jax.reference_train", "--config-json", str(tmp_path / "config.json"),
         "--tokens", tokens, "--out", str(tmp_path / "ref"), "--quiet"])
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    ours = [m["loss"] for m in metrics if "loss" in m]
    ours_eval = [[m["step"], m["eval_loss"]] for m in metrics if "eval_loss" in m]
    ref = json.loads((tmp_path / "ref" / "losses.json").read_text())
    assert len(ours) == len(ref["losses"]) == 20
    print(f"max relative loss difference {max(abs(a - b) / abs(b) for a, b in zip(ours, ref['losses'])):.2e}")
    np.testing.assert_allclose(ours, ref["losses"], rtol=1e-4)
    assert [s for s, _ in ours_eval] == [s for s, _ in ref["eval_losses"]] == [10, 20]
    np.testing.assert_allclose([v for _, v in ours_eval], [v for _, v in ref["eval_losses"]], rtol=1e-4)
    assert ours[0] == pytest.approx(math.log(250), rel=0.02)  # the padding ids take no probability
    assert ours[-1] < ours[0]
    # The padding rows: zero at init, no gradient (masked), no decay of zeros.
    for path in (tmp_path / "run" / "params.safetensors", tmp_path / "ref" / "params.safetensors"):
        p = load_file(str(path))
        assert p["wte"].shape == (320, 32) and p["wpe"].shape == (16, 32)
        assert not np.any(p["wte"][250:]), path
        assert np.all(np.abs(p["wte"][:250]).sum(axis=1) > 0)
        assert "final_norm_bias" in p and "layers.1.b_proj" in p
    man = json.loads(open(os.path.join(run([STRATA, "plan", "configs/test.yml", *EQUIV]).stdout.splitlines()[0]
                                       .removeprefix("# bundle "), "manifest.json")).read())
    assert [r["kind"] for r in man["layers"]] == ["gpt2", "gpt2"]
    assert man["embed"]["programs"]["accum_tied"] == "embed_accum_tied"


def test_gpt2_padded_vocabulary_through_the_ffi_cross_entropy(tmp_path: Any) -> None:
    """EQUIV (gpt2, vocabulary 250 padded to 320) trained with
    kernels.cross_entropy=ffi against the same run on xla: every loss within
    rtol 1e-4, the padding rows still zero (no gradient reached them)."""
    from safetensors.numpy import load_file

    short = [a for a in EQUIV if not a.startswith("train.steps=")] + ["train.steps=8"]
    losses = {}
    for ce in ("xla", "ffi"):
        d = tmp_path / ce
        run([STRATA, "train", "configs/test.yml", *short, f"kernels.cross_entropy={ce}", f"run.dir={d}"])
        losses[ce] = [json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines() if '"loss"' in x
                      and "eval_loss" not in x]
        assert json.loads((d / "context.json").read_text())["kernels"]["cross_entropy"] == ce
    assert len(losses["ffi"]) == len(losses["xla"]) == 8
    np.testing.assert_allclose(losses["ffi"], losses["xla"], rtol=1e-4)
    p = load_file(str(tmp_path / "ffi" / "params.safetensors"))
    assert p["wte"].shape == (320, 32) and not np.any(p["wte"][250:])


# --- the block against an independent float64 implementation ---------------------

def _np_block(cfg: M.ModelConfig, p: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    def ln(v: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        mu = v.mean(-1, keepdims=True)
        var = ((v - mu) ** 2).mean(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + 1e-5) * g + b

    def gelu(u: np.ndarray) -> np.ndarray:
        return 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))

    B, T, D = x.shape
    H, Dh, KV = cfg.n_heads, cfg.head_dim, cfg.kv_heads
    h = ln(x, p["attn_norm"], p["attn_norm_bias"])
    q = (h @ p["wq"] + p["bq"]).reshape(B, T, H, Dh)
    k = (h @ p["wk"] + p["bk"]).reshape(B, T, KV, Dh)
    v = (h @ p["wv"] + p["bv"]).reshape(B, T, KV, Dh)
    out = np.zeros((B, T, H, Dh))
    for b in range(B):
        for j in range(H):
            kv = j // (H // KV)
            s = q[b, :, j] @ k[b, :, kv].T / math.sqrt(Dh)
            s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
            w = np.exp(s - s.max(-1, keepdims=True))
            out[b, :, j] = (w / w.sum(-1, keepdims=True)) @ v[b, :, kv]
    x = x + out.reshape(B, T, D) @ p["wo"] + p["bo"]
    h = ln(x, p["mlp_norm"], p["mlp_norm_bias"])
    return x + gelu(h @ p["w_fc"] + p["b_fc"]) @ p["w_proj"] + p["b_proj"]


@pytest.mark.parametrize("kv", [4, 2])
def test_block_forward_matches_numpy_float64(kv: int) -> None:
    cfg = cfg_of(n_kv_heads=kv)
    rng = np.random.default_rng(1)
    p = {n: rng.normal(0, 0.3 if len(G.gpt2_shape(cfg, n)) > 1 else 1.0, G.gpt2_shape(cfg, n))
         for n in G.GPT2_PARAMS}
    x = rng.normal(0, 1, (2, cfg.seq_len, cfg.d_model))
    got = np.asarray(jax.jit(lambda p_, x_: G.gpt2_fwd(cfg, p_, x_))(
        {n: jnp.asarray(a, jnp.float32) for n, a in p.items()}, jnp.asarray(x, jnp.float32)))
    want = _np_block(cfg, p, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_init_biases_zero_gains_one_and_residual_scale() -> None:
    cfg = cfg_of(n_layers=8)
    p = G.gpt2_init(cfg, jnp.int32(0), jnp.int32(1), jnp.int32(8))
    for n in G.GPT2_ZEROS:
        assert not np.any(np.asarray(p[n])), n
    assert np.all(np.asarray(p["attn_norm"]) == 1) and np.all(np.asarray(p["mlp_norm"]) == 1)
    assert float(jnp.std(p["w_fc"])) == pytest.approx(0.02, rel=0.1)
    assert float(jnp.std(p["w_proj"])) == pytest.approx(0.02 / 4, rel=0.1)  # 1 / sqrt(2 * 8)


# --- the family's embedding and head -----------------------------------------------

def test_embedding_adds_learned_positions_and_head_is_layer_norm() -> None:
    cfg = cfg_of()
    params = M.init_params(cfg, 5)
    wte, wpe = params["embed"]["wte"], params["embed"]["wpe"]
    assert wpe.shape == (cfg.seq_len, cfg.d_model) and float(jnp.std(wpe)) > 0
    tok = jnp.asarray(np.arange(16).reshape(2, 8) % cfg.vocab_size, jnp.int32)
    progs = PR.programs_by_name(cfg)
    (x,) = progs["embed_fwd"].fn(wte, wpe, tok)
    np.testing.assert_allclose(np.asarray(x), np.asarray(wte)[np.asarray(tok)] + np.asarray(wpe)[None], rtol=1e-6)
    # decode at position 5 = the full embedding's row 5
    (x1,) = progs["embed_decode"].fn(wte, wpe, tok[:1, 5:6], jnp.int32(5))
    np.testing.assert_allclose(np.asarray(x1)[0, 0], np.asarray(x)[0, 5], rtol=1e-6)
    head = {"final_norm": jnp.full((cfg.d_model,), 2.0), "final_norm_bias": jnp.full((cfg.d_model,), 0.5)}
    h = np.asarray(M.final_norm(cfg, head, x), np.float64)
    xs = np.asarray(x, np.float64)
    want = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-5) * 2.0 + 0.5
    np.testing.assert_allclose(h, want, rtol=1e-4, atol=1e-5)
    assert M.head_param_names(cfg) == ("final_norm", "final_norm_bias")
    assert M.group_param_names(cfg, "embed") == ("wte", "wpe")


# --- the padded vocabulary ---------------------------------------------------------

@pytest.mark.parametrize("ce", ["xla", "pallas"])
@pytest.mark.parametrize("tied", [True, False])
def test_padding_logits_are_masked_out_of_the_loss(tied: bool, ce: str) -> None:
    """With large padding rows (as if trained), head_loss equals the
    cross-entropy over the vocab_size real ids only and gives the padding
    rows no gradient; head_logits returns vocab_size logits. Without the
    mask the padding ids would take almost all the probability. The same
    through the cross-entropy kernel (kernels.cross_entropy=pallas: the
    padding ids reach it as -1e30)."""
    V, Vp = 60, 64
    cfg = cfg_of(vocab_padded=Vp, tie_embeddings=tied, kernels=(("cross_entropy", ce),) if ce != "xla" else ())
    rng = np.random.default_rng(2)
    D = cfg.d_model
    w = rng.normal(0, 1, (Vp, D)).astype(np.float32)
    w[V:] = 50.0  # huge padding logits for any x with a positive mean row
    head = {"final_norm": jnp.ones((D,)), "final_norm_bias": jnp.full((D,), 1.0)}
    if not tied:
        head["w_out"] = jnp.asarray(w.T)
    x = jnp.asarray(rng.normal(0, 1, (2, cfg.seq_len, D)).astype(np.float32))
    tgt = jnp.asarray(rng.integers(0, V, (2, cfg.seq_len)), jnp.int32)
    mask = jnp.ones((2, cfg.seq_len), jnp.float32)
    progs = PR.programs_by_name(cfg)
    names = M.head_param_names(cfg)
    args = [head[n] for n in names] + ([jnp.asarray(w)] if tied else []) + [x, tgt, mask]
    out = progs["head_loss"].fn(*args)
    loss = float(out[0])
    h = np.asarray(M.final_norm(cfg, head, x), np.float64)
    logits = h @ w.astype(np.float64).T
    assert logits[..., V:].max() > logits[..., :V].max() + 10  # the mask has something to do
    real = logits[..., :V]
    lse = np.log(np.exp(real - real.max(-1, keepdims=True)).sum(-1)) + real.max(-1)
    want = float(np.mean(lse - np.take_along_axis(real, np.asarray(tgt)[..., None], -1)[..., 0]))
    assert loss == pytest.approx(want, rel=1e-4)
    grads = dict(zip([f"grad_{n}" for n in names] + (["grad_wte"] if tied else []) + ["dx"], out[1:]))
    gw = np.asarray(grads["grad_wte"] if tied else grads["grad_w_out"].T)
    assert gw.shape == (Vp, D) and not np.any(gw[V:]) and np.any(gw[:V])
    assert float(progs["head_eval"].fn(*args)[0]) == pytest.approx(loss, rel=1e-6)
    lg = progs["head_logits"].fn(*[head[n] for n in names], *([jnp.asarray(w)] if tied else []), x[:1, :1])[0]
    assert lg.shape == (1, 1, V)
    np.testing.assert_allclose(np.asarray(lg)[0, 0], real[0, 0], rtol=1e-4, atol=1e-4)


def test_padding_rows_start_at_zero_and_shapes_follow_vocab_padded() -> None:
    cfg = cfg_of(vocab_padded=64, tie_embeddings=False)
    p = M.init_params(cfg, 0)
    assert p["embed"]["wte"].shape == (64, 32) and p["head"]["w_out"].shape == (32, 64)
    assert not np.any(np.asarray(p["embed"]["wte"])[60:]) and not np.any(np.asarray(p["head"]["w_out"])[:, 60:])
    # vocab_padded 0 (or equal) is no padding; the model JSON leaves it out at 0
    assert "vocab_padded" not in cfg_of().to_dict() and cfg_of().vocab_rows == 60
    assert M.ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"model.vocab_padded \(59\) must be 0 or at least model.vocab_size \(60\)"):
        cfg_of(vocab_padded=59)


def test_kinds_of_two_families_are_refused() -> None:
    with pytest.raises(ValueError, match=r"model.layers: block kinds of different families"):
        cfg_of(layers=("gpt2", "llama"), block="llama")


def test_gpt2_on_a_mesh_exits_2(tmp_path: Any) -> None:
    """Not built for a device mesh yet: a config error naming the kind."""
    r = subprocess.run([STRATA, "plan", "configs/test.yml", "model.block=gpt2", "parallel.data=2", "train.microbatches=1",
                        "runtime.cpu_devices=2", f"runtime.cache_dir={tmp_path}"], cwd=ROOT, capture_output=True,
                       text=True, env=ENV)
    assert r.returncode == 2, r.stderr
    assert "'gpt2'" in r.stderr and "model.block/model.layers" in r.stderr, r.stderr
