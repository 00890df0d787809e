"""The exporter: manifest contents, program texts, atomic writes, CLI."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from typing import Any

import jax
import jaxlib
import numpy as np
import pytest
from conftest import ROOT, tiny_model

from strata_jax import export as E
from strata_jax.model import ModelConfig
from strata_jax.programs import build_programs, fsdp_programs

MLIR_DTYPE = {"f32": "f32", "bf16": "bf16", "s32": "i32", "u32": "ui32"}
EXPECTED_PROGRAMS = [
    "embed_init", "block_init", "head_init", "embed_fwd", "embed_bwd", "block_fwd", "block_bwd",
    "head_loss", "head_eval",
    "accum_embed", "sqnorm_embed", "adamw_embed", "accum_block", "sqnorm_block", "adamw_block",
    "accum_head", "sqnorm_head", "adamw_head", "block_fwd_res", "block_bwd_res",
    "embed_prefill", "embed_decode", "block_prefill", "block_decode", "head_logits",
    "act_stats", "adamw_stats_embed", "adamw_stats_block", "adamw_stats_head",
]


def _mlir_type(spec: dict[str, Any]) -> str:
    dims = "".join(f"{d}x" for d in spec["shape"])
    return f"tensor<{dims}{MLIR_DTYPE[spec['dtype']]}>"


def _main_signature(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """[(arg type, arg attributes)], [result types] of `func.func public @main`."""
    m = re.search(r"func\.func public @main\((.*?)\) -> \(?(.*?)\)? \{\n", text)
    assert m, "no public @main"
    args = re.findall(r"%arg\d+: (tensor<[^>]*>)( \{[^}]*\})?", m.group(1))
    results = re.findall(r"tensor<[^>]*>", m.group(2))
    return args, results


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[str, dict[str, Any]]]:
    out = {}
    for n in (2, 12):
        d = str(tmp_path_factory.mktemp("bundles") / f"b{n}")
        out[n] = (d, E.export_bundle(ModelConfig.from_dict(tiny_model(n_layers=n)), d, f"key{n}"))
    return out


def test_manifest_is_complete(bundles: dict[int, tuple[str, dict[str, Any]]]) -> None:
    for n, (d, man) in bundles.items():
        with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
            assert json.load(f) == man
        assert man["schema_version"] == 1 and man["bundle_key"] == f"key{n}"
        assert man["exporter"]["name"] == "strata_jax"
        assert man["versions"] == {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
        assert man["model"]["n_layers"] == n
        assert [p["name"] for p in man["programs"]] == EXPECTED_PROGRAMS
        assert [g["name"] for g in man["groups"]] == ["embed", "block", "head"]
        assert man["groups"][1]["params"] == ["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm",
                                               "w_gate", "w_up", "w_down"]
        assert man["groups"][2]["params"] == ["final_norm"]
        assert len(man["params"]) == 1 + 9 * n + 1
        assert len(man["layers"]) == n and man["layers"][-1]["index"] == n - 1
        # The program tables: the C plan builder takes every name from them.
        assert man["embed"] == {"group": "embed", "programs": {
            "init": "embed_init", "fwd": "embed_fwd", "bwd": "embed_bwd",
            "prefill": "embed_prefill", "decode": "embed_decode"}}
        assert man["head"] == {"group": "head", "programs": {
            "init": "head_init", "loss": "head_loss", "eval": "head_eval", "logits": "head_logits"}}
        assert all(row["programs"] == {"init": "block_init", "fwd": "block_fwd", "bwd": "block_bwd",
                                       "fwd_res": "block_fwd_res", "bwd_res": "block_bwd_res",
                                       "prefill": "block_prefill", "decode": "block_decode",
                                       "act_stats": "act_stats"}
                   for row in man["layers"])
        assert [g["programs"] for g in man["groups"]] == [
            {"accum": f"accum_{g}", "sqnorm": f"sqnorm_{g}", "adamw": f"adamw_{g}", "adamw_stats": f"adamw_stats_{g}"}
            for g in ("embed", "block", "head")]
        named = [v for t in [man["embed"], man["head"], *man["layers"], *man["groups"]] for v in t["programs"].values()]
        assert set(named) <= {p["name"] for p in man["programs"]}
        assert len({p["name"] for p in man["params"]}) == len(man["params"])
        wq = next(p for p in man["params"] if p["name"] == f"layers.{n - 1}.wq")
        assert wq == {"name": f"layers.{n - 1}.wq", "group": "block", "layer": n - 1, "local": "wq",
                      "shape": [32, 32], "dtype": "f32", "init": "normal(0.02)", "decay": True}
        norm = next(p for p in man["params"] if p["name"] == "final_norm")
        assert norm["init"] == "ones" and norm["decay"] is False and norm["layer"] == -1
        for p in man["programs"]:
            with open(os.path.join(d, p["file"]), "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == p["sha256"]
            assert p["flops"] >= 0
        assert not [x for x in os.listdir(os.path.dirname(d)) if ".tmp-" in x or ".old-" in x]


def test_program_tables_name_only_exported_programs() -> None:
    cfg = ModelConfig.from_dict(tiny_model())
    names = {p.name for p in build_programs(cfg)}
    assert E.program_tables(cfg, names)["layers"][0]["programs"]["bwd_res"] == "block_bwd_res"
    with pytest.raises(E.ExportError, match="block_bwd_res"):
        E.program_tables(cfg, names - {"block_bwd_res"})


def test_process_fsdp_tables_name_block_programs() -> None:
    """fsdp across processes (--process-fsdp 2): each group's shard_programs
    are its optimizer programs on one process's block of 1/2 (dim 0 cut in
    ceil(d0/2) rows), and the one-device statistics programs are left out."""
    cfg = ModelConfig.from_dict(tiny_model())
    progs = build_programs(cfg) + fsdp_programs(cfg, 2)
    tables = E.program_tables(cfg, {p.name for p in progs}, process_fsdp=2)
    for g in tables["groups"]:
        assert g["shard_programs"] == {r: f"{r}_{g['name']}_fsdp2" for r in ("accum", "sqnorm", "adamw")}
        assert "adamw_stats" not in g["programs"]
    adamw = {p.name: p for p in progs}["adamw_embed_fsdp2"]
    assert adamw.inputs[0].shape == (-(-cfg.vocab_size // 2), cfg.d_model)


def test_programs_do_not_depend_on_n_layers(
        bundles: dict[int, tuple[str, dict[str, Any]]]) -> None:
    (_, m2), (_, m12) = bundles[2], bundles[12]
    strip = [{k: v for k, v in p.items() if k not in ("sha256", "flops")} for p in m2["programs"]]
    assert strip == [{k: v for k, v in p.items() if k not in ("sha256", "flops")} for p in m12["programs"]]
    sha2 = {p["name"]: p["sha256"] for p in m2["programs"]}
    sha12 = {p["name"]: p["sha256"] for p in m12["programs"]}
    # not even block_init: the depth (the residual-output init scale) is its input
    assert sha2 == sha12


def test_program_texts_match_their_tables(bundles: dict[int, tuple[str, dict[str, Any]]]) -> None:
    d, man = bundles[2]
    for p in man["programs"]:
        with open(os.path.join(d, p["file"]), encoding="utf-8") as f:
            text = f.read()
        assert text.startswith("module @")
        args, results = _main_signature(text)
        assert [a for a, _ in args] == [_mlir_type(s) for s in p["inputs"]], p["name"]
        assert results == [_mlir_type(s) for s in p["outputs"]], p["name"]
        donated = [i for i, (_, attrs) in enumerate(args)
                   if "tf.aliasing_output" in attrs or "jax.buffer_donor" in attrs]
        assert donated == p["donated"], p["name"]
        assert "custom_call" not in text, p["name"]


def test_untied_bf16_bundle_and_roles(tmp_path: Any) -> None:
    cfg = ModelConfig.from_dict(tiny_model(tie_embeddings=False, compute_dtype="bf16"))
    man = E.export_bundle(cfg, str(tmp_path / "b"))
    progs = {p["name"]: p for p in man["programs"]}
    hl = progs["head_loss"]
    assert [s["name"] for s in hl["inputs"]] == ["final_norm", "w_out", "x", "targets", "mask"]
    assert [s["role"] for s in hl["outputs"]] == ["loss", "grad", "grad", "activation_grad"]
    assert man["groups"][2]["params"] == ["final_norm", "w_out"]
    assert man["bundle_key"] == E.default_bundle_key(cfg)
    ad = progs["adamw_head"]
    assert [s["role"] for s in ad["inputs"]] == ["param"] * 2 + ["grad"] * 2 + ["opt_m"] * 2 + \
        ["opt_v"] * 2 + ["scalar"] * 4
    assert ad["donated"] == [0, 1, 4, 5, 6, 7]
    # every tensor crossing programs is f32 in bf16 mode too, but the
    # residuals that are only bf16 matmul operands (docs/model.md, "Mixed precision")
    for p in man["programs"]:
        for s in p["inputs"] + p["outputs"]:
            want = ("bf16",) if s["role"] == "residual" and s["name"] not in ("attn_lse", "x_mid") else ("f32", "s32")
            assert s["dtype"] in want, (p["name"], s)


def test_mlir_text_runs_like_the_jax_functions(bundles: dict[int, tuple[str, dict[str, Any]]],
                                               mlir_runner_factory: Any) -> None:
    """Compile the written text (what the C side loads) and compare with the Python functions."""
    d, man = bundles[2]
    run = mlir_runner_factory(d, man)
    cfg = ModelConfig.from_dict(man["model"])
    fns = {p.name: p.fn for p in build_programs(cfg)}
    rng = np.random.default_rng(0)
    for name in ("embed_init", "block_init", "block_bwd", "head_loss", "adamw_block"):
        spec = run.programs[name]
        args = []
        for s in spec["inputs"]:
            if s["dtype"] == "s32":
                args.append(np.asarray(rng.integers(0, 64, s["shape"]), np.int32))
            elif s["name"] == "hyper":
                args.append(np.array([0.9, 0.95, 1e-8, 0.1], np.float32))
            else:
                args.append(np.asarray(rng.random(s["shape"]) + 0.5, np.float32))
        got = run(name, *args)
        want = jax.jit(fns[name])(*args)
        assert len(got) == len(want) == len(spec["outputs"])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_cli_replaces_bundle_atomically(tmp_path: Any) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    cmd = [sys.executable, "-m", "strata_jax.export", "--model-json", json.dumps(tiny_model()),
           "--out", str(out), "--bundle-key", "k1"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == ["manifest.json", "programs"]
    assert json.loads((out / "manifest.json").read_text())["bundle_key"] == "k1"
    assert sorted(os.listdir(tmp_path)) == ["bundle"]
    bad = subprocess.run(cmd[:4] + ['{"vocab_size": 3}', "--out", str(out)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "missing keys" in bad.stderr
    assert (out / "manifest.json").exists()


@pytest.mark.parametrize("mesh", [None, "data=2", "fsdp=2,tensor=2"])
def test_progress_fd_counts_every_program(tmp_path: Any, mesh: str | None) -> None:
    """--progress-fd: "export: k/n programs", k = 1..n, n every program the
    manifest lists (collectives and SPMD programs included), on that fd
    only, not in the exporter's own output (its log)."""
    r, w = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    cmd = [sys.executable, "-m", "strata_jax.export", "--model-json", json.dumps(tiny_model()),
           "--out", str(tmp_path / "b"), "--progress-fd", str(w)] + (["--mesh", mesh] if mesh else [])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, pass_fds=(w,))
    os.close(w)
    with os.fdopen(r, newline="") as f:
        drawn = f.read()
    assert p.returncode == 0, p.stderr
    man = json.loads((tmp_path / "b" / "manifest.json").read_text())
    n = len(man["programs"]) + len(man.get("collectives", [])) + len(man.get("spmd_programs", []))
    assert drawn.endswith("\n") and drawn.count("\n") == 1, drawn
    assert drawn.strip("\n").split("\r")[1:] == [f"export: {k}/{n} programs" for k in range(1, n + 1)], drawn
    assert "programs\r" not in p.stdout + p.stderr and not re.search(r"export: \d+/", p.stdout + p.stderr)
