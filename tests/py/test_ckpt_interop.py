"""Checkpoint interoperability (issue 5, item 9): the `safetensors` Python
package reads strata checkpoints, and strata reads what it writes.

A 10-step run with a checkpoint every 5 steps:
  - the final checkpoint (LATEST) loads with safetensors.numpy; its tensors
    are bitwise the trainer's final parameters (params.safetensors, written
    from a separate device->host copy at the end of the run);
  - the optimizer file holds m and v for every parameter, same shapes;
  - the manifest agrees with what the package reads: names, dtypes, shapes,
    and each tensor's xxh64 (computed here with libxxhash through ctypes);
  - the mid-run checkpoint differs from the final one (it is a real
    snapshot of step 5, not a copy of the end state);
  - a file written by the package is accepted by `strata ckpt inspect`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.environ.get("STRATA") or os.path.join(ROOT, "build", "strata")
OVERRIDES = ["runtime.deterministic=true", "run.progress=off", "train.steps=10", "ckpt.every=5", "ckpt.keep=5"]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


def xxh64(data: bytes) -> int:
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
    lib.XXH64.restype = ctypes.c_uint64
    lib.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
    return lib.XXH64(data, len(data), 0)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not os.path.exists(STRATA):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    d = str(tmp_path_factory.mktemp("ckpt") / "run")
    run([STRATA, "train", "configs/test.yml", *OVERRIDES, f"run.dir={d}"])
    return d


def latest(run_dir: str) -> str:
    root = os.path.join(run_dir, "checkpoints")
    name = open(os.path.join(root, "LATEST"), encoding="utf-8").read().strip()
    return os.path.join(root, name)


def test_latest_params_equal_final_params(run_dir: str) -> None:
    ckpt = latest(run_dir)
    assert ckpt.endswith("step_10")
    got = load_file(os.path.join(ckpt, "params.safetensors"))
    final = load_file(os.path.join(run_dir, "params.safetensors"))
    assert set(got) == set(final) and len(got) > 10
    for name, want in final.items():
        assert got[name].dtype == np.float32 and got[name].shape == want.shape, name
        assert got[name].tobytes() == want.tobytes(), f"{name} differs from the trainer's final parameters"


def test_optimizer_state_has_m_and_v_for_every_param(run_dir: str) -> None:
    ckpt = latest(run_dir)
    params = load_file(os.path.join(ckpt, "params.safetensors"))
    opt = load_file(os.path.join(ckpt, "optimizer.safetensors"))
    assert set(opt) == {f"{k}:{p}" for p in params for k in ("m", "v")}
    for p, arr in params.items():
        assert opt[f"m:{p}"].shape == arr.shape and opt[f"v:{p}"].shape == arr.shape
        assert np.all(opt[f"v:{p}"] >= 0), f"v:{p} has negative second moments"
        assert np.any(opt[f"m:{p}"] != 0), f"m:{p} is all zeros after 10 steps"
    with safe_open(os.path.join(ckpt, "params.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "writer": "strata"}


def test_manifest_matches_what_safetensors_reads(run_dir: str) -> None:
    ckpt = latest(run_dir)
    m = json.load(open(os.path.join(ckpt, "manifest.json"), encoding="utf-8"))
    assert m["format"] == "strata-checkpoint" and m["version"] == 1
    assert m["step"] == 10 and m["optimizer_step"] == 10
    assert m["data"]["position"] == 10 * m["data"]["batch_size"] == 10 * m["config"]["train"]["batch_size"]
    assert m["rng"]["seed"] == m["config"]["seed"]
    assert m["model"]["d_model"] == m["config"]["model"]["d_model"]
    files = {f["file"]: load_file(os.path.join(ckpt, f["file"])) for f in m["files"]}
    assert len(m["tensors"]) == sum(len(t) for t in files.values())
    for t in m["tensors"]:
        arr = files[t["file"]][t["name"]]
        assert t["dtype"] == "F32" and list(arr.shape) == t["shape"], t["name"]
        assert t["bytes"] == arr.nbytes
        assert int(t["xxh64"], 16) == xxh64(arr.tobytes()), f"{t['name']}: manifest checksum does not match the data"
    for f in m["files"]:
        raw = open(os.path.join(ckpt, f["file"]), "rb").read()
        assert len(raw) == f["bytes"] and int(f["xxh64"], 16) == xxh64(raw)


def test_mid_run_checkpoint_is_a_real_snapshot(run_dir: str) -> None:
    mid = load_file(os.path.join(run_dir, "checkpoints", "step_5", "params.safetensors"))
    end = load_file(os.path.join(latest(run_dir), "params.safetensors"))
    changed = [n for n in mid if mid[n].tobytes() != end[n].tobytes()]
    assert len(changed) == len(mid), f"unchanged between step 5 and 10: {set(mid) - set(changed)}"


def test_strata_reads_a_file_written_by_safetensors(tmp_path) -> None:
    path = str(tmp_path / "py.safetensors")
    tensors = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b.c": np.array([1, -2, 3], dtype=np.int32)}
    save_file(tensors, path)
    out = run([STRATA, "ckpt", "inspect", path]).stdout
    assert "2 tensors" in out
    assert f"{xxh64(tensors['a'].tobytes()):016x}" in out and "[3,4]" in out
    assert f"{xxh64(tensors['b.c'].tobytes()):016x}" in out and "I32" in out
