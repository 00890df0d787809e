"""strata_jax.parallel: the SPMD collective programs and their manifest entries.

JAX fixes its device count when its backend starts, and the rest of the suite
starts it with one CPU device, so everything that needs 4 (or, for the mesh
with all three axes, 8) devices runs in a child process (this file run as a
script, with XLA_FLAGS set) and reports back as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = os.path.join(ROOT, ".venv", "bin", "python")
if not os.path.exists(PY):
    PY = sys.executable


def _child_env(devices: int = 4) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    return env


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    out = str(tmp_path_factory.mktemp("spmd"))
    r = subprocess.run([PY, "-m", "strata_jax.parallel", out], env=_child_env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(out, "spmd_manifest.json"), encoding="utf-8") as f:
        return out, json.load(f)


@pytest.fixture(scope="module")
def child_results() -> dict:
    # 8 devices: the layer collectives of data=2 x fsdp=2 x tensor=2 (the
    # smaller meshes take the first devices, as they do with 4)
    r = subprocess.run([PY, os.path.abspath(__file__), "--child"], env=_child_env(8), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _entry(manifest: dict, name: str) -> dict:
    for e in manifest["collectives"]:
        if e["name"] == name:
            return e
    raise AssertionError(f"{name} not in the manifest")


def test_manifest_fields(exported: tuple[str, dict]) -> None:
    _, m = exported
    assert m["mesh_axes"] == ["data", "fsdp", "tensor"]
    assert len(m["collectives"]) == 19
    for e in m["collectives"]:
        for key in ("name", "file", "kind", "donated", "axis", "axis_size", "mesh", "num_partitions", "num_replicas",
                    "groups", "bytes_per_device", "wire_bytes_per_device", "inputs", "outputs"):
            assert key in e, (e["name"], key)
        assert e["kind"] in ("all_gather", "reduce_scatter", "all_reduce")
        assert e["num_partitions"] == e["mesh"]["data"] * e["mesh"]["fsdp"] * e["mesh"]["tensor"]
        for t in e["inputs"] + e["outputs"]:
            assert t["layout"]["spec"][0] == ["data", "fsdp", "tensor"]
            assert t["layout"]["global_shape"][0] == e["num_partitions"] * t["local_shape"][0]

    # fsdp=4, w f32[6,3] and b f32[5]: 2 rows per device, padded to 8 rows.
    ag = _entry(m, "fsdp4_all_gather")
    assert (ag["kind"], ag["axis"], ag["axis_size"]) == ("all_gather", "fsdp", 4)
    assert [t["local_shape"] for t in ag["inputs"]] == [[2, 3], [2]]
    assert [t["local_shape"] for t in ag["outputs"]] == [[6, 3], [5]]
    assert ag["inputs"][0]["logical"] == {"kind": "sharded", "axis": "fsdp", "dim": 0}
    assert ag["outputs"][0]["logical"] == {"kind": "replicated", "axis": "fsdp"}
    assert ag["bytes_per_device"] == (8 * 3 + 8) * 4
    assert ag["wire_bytes_per_device"] == (8 * 3 + 8) * 4 * 3 // 4

    rs = _entry(m, "fsdp2_reduce_scatter")
    assert [t["local_shape"] for t in rs["inputs"]] == [[6, 3], [5]]
    assert [t["local_shape"] for t in rs["outputs"]] == [[3, 3], [3]]
    assert rs["inputs"][1]["logical"] == {"kind": "partial", "axis": "fsdp"}
    assert rs["bytes_per_device"] == (6 * 3 + 6) * 4
    assert rs["wire_bytes_per_device"] == (6 * 3 + 6) * 4 // 2

    assert _entry(m, "data2_all_reduce_donated")["donated"] == [0, 1]
    assert _entry(m, "data2_all_reduce")["donated"] == []
    ar = _entry(m, "d2f2_data_all_reduce")
    assert (ar["axis"], ar["axis_size"], ar["num_partitions"]) == ("data", 2, 4)
    assert ar["groups"] == [[0, 2], [1, 3]]
    assert _entry(m, "d2f2_fsdp_all_reduce")["groups"] == [[0, 1], [2, 3]]
    assert _entry(m, "f2t2_fsdp_all_reduce")["groups"] == [[0, 2], [1, 3]]
    assert ar["bytes_per_device"] == (6 * 3 + 5) * 4
    assert ar["wire_bytes_per_device"] == 2 * (6 * 3 + 5) * 4 // 2


def test_exported_text_is_spmd(exported: tuple[str, dict]) -> None:
    out, m = exported
    for e in m["collectives"]:
        with open(os.path.join(out, e["file"]), encoding="utf-8") as f:
            text = f.read()
        n = e["num_partitions"]
        assert f"mhlo.num_partitions = {n} : i32" in text, e["name"]
        assert "mhlo.num_replicas = 1 : i32" in text
        main = text[text.index("func.func public @main("):]
        main = main[:main.index("{\n")]
        # a Shardy sharding on every input and every output of @main
        assert main.count("sdy.sharding = #sdy.sharding<@mesh") == len(e["inputs"]) + len(e["outputs"]), e["name"]
        op = {"all_gather": "stablehlo.all_gather", "reduce_scatter": "stablehlo.reduce_scatter",
              "all_reduce": "stablehlo.all_reduce"}[e["kind"]]
        assert op in text, e["name"]
        assert f'#stablehlo.axis_ref<name = "{e["axis"]}">' in text, e["name"]


def test_collectives_match_reference(child_results: dict) -> None:
    """Every test program and a tiny model's layer collectives (on data=2 x
    fsdp=2, and the tensor-local blocks on fsdp=2 x tensor=2, data=2 x
    tensor=2 and data=2 x fsdp=2 x tensor=2), run by JAX on CPU devices,
    equal the collective computed with numpy (within each group of the
    collective's axis: a wrong group on the three-axis mesh fails here)."""
    res = child_results["programs"]
    assert len(res) == 19 + 3 + 2 + 1 + 3
    assert {"block_fsdp_all_gather@2x2x2", "block_fsdp_reduce_scatter@2x2x2", "block_data_all_reduce@2x2x2"} <= set(res)
    bad = {k: v for k, v in res.items() if v != "ok"}
    assert not bad, bad


def test_layer_collectives_bytes(child_results: dict) -> None:
    # tiny model (d_model 32, d_ff 64) on data=2 x fsdp=2: the block's 9
    # parameters, every dimension 0 a multiple of 2, so no padding.
    layer = child_results["layer"]
    params = 2 * 32 + 4 * 32 * 32 + 2 * 32 * 64 + 64 * 32
    assert layer["block_fsdp_all_gather"] == params * 4
    assert layer["block_fsdp_reduce_scatter"] == params * 4
    # HSDP: the data all-reduce runs on the fsdp shards, half of each tensor
    assert layer["block_data_all_reduce"] == params * 4 // 2
    # data=2 x fsdp=2 x tensor=2: the fsdp collectives move the tensor blocks
    # (the norm gains whole), the data all-reduce their fsdp halves
    tblocks = 2 * 32 + (4 * 32 * 32 + 2 * 32 * 64 + 64 * 32) // 2
    three = child_results["layer3"]
    assert three["block_fsdp_all_gather"] == three["block_fsdp_reduce_scatter"] == tblocks * 4
    assert three["block_data_all_reduce"] == tblocks * 4 // 2


def test_bundle_with_mesh(tmp_path) -> None:  # noqa: ANN001
    """`strata_jax.export --mesh` adds the mesh and every group's collectives
    to an otherwise unchanged bundle; it sets JAX's device count itself (the
    child gets no XLA_FLAGS)."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from conftest import tiny_model
    from strata_jax.model import ModelConfig
    from strata_jax.programs import build_programs, fsdp_programs

    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    model = tiny_model(tie_embeddings=False)
    out = str(tmp_path / "b")
    r = subprocess.run([PY, "-m", "strata_jax.export", "--model-json", json.dumps(model), "--out", out,
                        "--mesh", "data=2,fsdp=2"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        m = json.load(f)
    assert m["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1}
    cfg = ModelConfig.from_dict(model)
    # the one-device programs, then each group's optimizer programs on fsdp blocks
    assert [p["name"] for p in m["programs"]] == [p.name for p in build_programs(cfg) + fsdp_programs(cfg, 2)]
    blocks = {p["name"]: p for p in m["programs"]}["adamw_block_fsdp2"]
    assert blocks["inputs"][0]["shape"][0] == -(-model["d_model"] // 2)  # attn_norm [D]: ceil(D / 2) rows
    assert {g["name"]: g["shard_programs"]["adamw"] for g in m["groups"]} == {
        g: f"adamw_{g}_fsdp2" for g in ("embed", "block", "head")}
    names = [c["name"] for c in m["collectives"]]
    assert names == [f"{g}_{k}" for g in ("embed", "block", "head")
                     for k in ("fsdp_all_gather", "fsdp_reduce_scatter", "data_all_reduce")]
    head = {c["name"]: c for c in m["collectives"]}["head_fsdp_all_gather"]
    assert [t["name"] for t in head["inputs"]] == ["final_norm", "w_out"]
    # final_norm f32[32], w_out f32[32,64]: 16 rows each per device
    assert [t["local_shape"] for t in head["inputs"]] == [[16], [16, 64]]
    assert head["bytes_per_device"] == (32 + 32 * 64) * 4
    for c in m["collectives"]:
        with open(os.path.join(out, c["file"]), "rb") as f:
            data = f.read()
        import hashlib
        assert hashlib.sha256(data).hexdigest() == c["sha256"]
        assert b"mhlo.num_partitions = 4 : i32" in data

    # a bad mesh is a usage error
    r = subprocess.run([PY, "-m", "strata_jax.export", "--model-json", json.dumps(model), "--out", str(tmp_path / "u"),
                        "--mesh", "pipe=2"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2
    assert "expected axis=size items with axes data, fsdp, tensor, each once" in r.stderr


def test_bundle_with_all_three_axes(tmp_path) -> None:  # noqa: ANN001
    """--mesh data=2,fsdp=2,tensor=2 (8 devices, set by the exporter): every
    group's fsdp all-gather and reduce-scatter and data all-reduce, the
    block's on its tensor blocks; the fsdp collectives within each (data,
    tensor) coordinate, the data all-reduce on the fsdp shards within each
    (fsdp, tensor) coordinate; the tensor-parallel block programs over all 8."""
    from conftest import export_tiny_manifest

    out = str(tmp_path / "b")
    m = export_tiny_manifest(out, "data=2,fsdp=2,tensor=2")
    assert m["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    assert [p["name"] for p in m["spmd_programs"]] == [
        "tp_block_fwd", "tp_block_bwd", "tp_block_fwd_res", "tp_block_bwd_res"]
    assert all(p["num_partitions"] == 8 for p in m["spmd_programs"])
    assert {g["name"]: g["shard_programs"]["adamw"] for g in m["groups"]} == {
        g: f"adamw_{g}_fsdp2_tp2" for g in ("embed", "block", "head")}
    c = {e["name"]: e for e in m["collectives"]}
    assert list(c) == [f"{g}_{k}" for g in ("embed", "block", "head")
                       for k in ("fsdp_all_gather", "fsdp_reduce_scatter", "data_all_reduce")]
    assert all(e["num_partitions"] == 8 for e in c.values())
    ag, rs, ar = c["block_fsdp_all_gather"], c["block_fsdp_reduce_scatter"], c["block_data_all_reduce"]
    assert ag["groups"] == rs["groups"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert ar["groups"] == c["embed_data_all_reduce"]["groups"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # wo f32[32,32]: dim 0 over tensor -> [16,32], fsdp blocks of 8 rows,
    # which the data all-reduce moves; wq [32,16] -> [16,16]; the gains whole
    wq, wo, gain = ar["inputs"][1], ar["inputs"][4], ar["inputs"][0]
    assert (wo["name"], wo["shape"], wo["local_shape"], wo["tensor_cut"]) == (
        "wo", [8, 32], [8, 32], {"axis": "tensor", "dim": 0})
    assert (ag["inputs"][4]["shape"], ag["inputs"][4]["local_shape"]) == ([16, 32], [8, 32])
    assert (wq["name"], wq["local_shape"], wq["tensor_cut"]) == ("wq", [16, 16], {"axis": "tensor", "dim": 1})
    assert gain["name"] == "attn_norm" and "tensor_cut" not in gain and gain["local_shape"] == [16]
    tblocks = 2 * 32 + (4 * 32 * 32 + 3 * 32 * 64) // 2
    assert ag["bytes_per_device"] == rs["bytes_per_device"] == tblocks * 4
    assert ar["bytes_per_device"] == tblocks * 4 // 2
    for e in c.values():
        with open(os.path.join(out, e["file"]), "rb") as f:
            assert b"mhlo.num_partitions = 8 : i32" in f.read()


def test_bad_mesh() -> None:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from strata_jax import parallel as PP

    with pytest.raises(PP.ParallelError, match="mesh axis fsdp must be an integer >= 1, got 0"):
        PP.MeshSpec(fsdp=0)
    with pytest.raises(PP.ParallelError, match="unknown mesh axis 'pipe'"):
        PP.MeshSpec(fsdp=2).size("pipe")
    with pytest.raises(PP.ParallelError, match="needs 8 devices, JAX has 4"):
        PP.make_mesh(PP.MeshSpec(data=2, fsdp=4), devices=["d"] * 4)


def _child() -> None:
    import numpy as np

    sys.path.insert(0, os.path.join(ROOT, "python"))
    from strata_jax import parallel as PP
    from strata_jax.model import ModelConfig

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from conftest import TINY_MODEL  # noqa: E402

    rng = np.random.default_rng(7)
    progs = PP.test_programs()
    cfg = ModelConfig.from_dict(TINY_MODEL)
    layer = PP.model_layer_collectives(cfg, PP.MeshSpec(data=2, fsdp=2))
    three = PP.model_layer_collectives(cfg, PP.MeshSpec(data=2, fsdp=2, tensor=2))
    tp_layers = PP.model_layer_collectives(cfg, PP.MeshSpec(fsdp=2, tensor=2)) + \
        PP.model_layer_collectives(cfg, PP.MeshSpec(data=2, tensor=2)) + three
    results: dict[str, str] = {}
    for prog in progs + layer + tp_layers:
        mesh = PP.make_mesh(prog.mesh)
        D = prog.mesh.devices
        ins = [[rng.standard_normal(s).astype(np.float32) for s in prog.local_inputs()] for _ in range(D)]
        got = prog.run(mesh, ins)
        want = PP.reference(prog, ins)
        status = "ok"
        for p in range(D):
            for i, s in enumerate(prog.local_outputs()):
                g, w = got[p][i], want[p][i]
                if g.shape != tuple(s) or w.shape != tuple(s):
                    status = f"partition {p} output {i}: shape {g.shape} / {w.shape}, want {tuple(s)}"
                elif not np.allclose(g, w, rtol=1e-6, atol=1e-6):
                    status = f"partition {p} output {i}: max diff {np.max(np.abs(g - w))}"
        m = prog.mesh
        results[prog.name if prog in progs else f"{prog.name}@{m.data}x{m.fsdp}x{m.tensor}"] = status
    print(json.dumps({"programs": results, "layer": {p.name: p.bytes_per_device() for p in layer},
                      "layer3": {p.name: p.bytes_per_device() for p in three}}))


if __name__ == "__main__" and "--child" in sys.argv:
    _child()
