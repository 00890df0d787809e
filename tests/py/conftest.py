"""Shared fixtures: python/ on sys.path, tiny configs, an MLIR-text program runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
STRATA = os.path.join(ROOT, "build", "strata")
# The environment strata_jax's command-line tools run in from a test.
PY_ENV = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python"), "JAX_PLATFORMS": "cpu"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "long: a long drill run by `make test-long`, not by `make test` (a shorter test of the same "
        "thing stays in make test; tests/README.md)")


def run_ok(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    """Runs |cmd| in the repository root; a non-zero exit fails the test with its output."""
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


# Every kernel op at xla (plain jnp, what the references compute): the
# default, kernels.<op>=auto, is strata's C kernels (ffi) on the CPU plugin.
# configs/test.yml sets this itself; a test of another config prepends it.
KERNELS_XLA = ["kernels.rmsnorm=xla", "kernels.swiglu=xla", "kernels.cross_entropy=xla", "kernels.attention=xla"]


def train_and_reference(config: str, over: list[str], out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`strata train CONFIG OVER...` into out/run, and strata_jax.reference_train
    on the same resolved config and token file into out/ref: the run's
    metrics.jsonl lines and the reference's losses.json. strata runs every
    kernel op at xla, as the reference does, unless |over| says otherwise."""
    over = [*KERNELS_XLA, *over]
    if not os.path.exists(STRATA):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    run_ok([STRATA, "train", config, *over, f"run.dir={out / 'run'}"])
    (out / "config.json").write_text(run_ok([STRATA, "config", "--json", config, *over]).stdout)
    from strata_jax.reference_train import token_files  # jax: imported where used
    # One token file, or one per source (data.packing none/pack)
    tokens = token_files(run_ok([STRATA, "data", config, *over]).stdout)
    run_ok([sys.executable, "-m", "strata_jax.reference_train", "--config-json", str(out / "config.json"),
            *[a for t in tokens for a in ("--tokens", t)], "--out", str(out / "ref"), "--quiet"], env=PY_ENV)
    metrics = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    return metrics, json.loads((out / "ref" / "losses.json").read_text())

TINY_MODEL: dict[str, Any] = {
    "vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "seq_len": 16,
    "tie_embeddings": True, "compute_dtype": "f32", "rope_theta": 10000.0, "init_std": 0.02,
    "microbatch_size": 2,
}


def tiny_model(**over: Any) -> dict[str, Any]:
    return {**TINY_MODEL, **over}


def export_tiny_manifest(out: str, mesh: str) -> dict[str, Any]:
    """`strata_jax.export` of the tiny model for |mesh| ("tensor=2",
    "data=2,fsdp=2,tensor=2") into |out| (XLA_FLAGS dropped: the exporter
    sets its own device count); its manifest."""
    env = {k: v for k, v in PY_ENV.items() if k != "XLA_FLAGS"}
    r = subprocess.run([os.path.join(ROOT, ".venv", "bin", "python"), "-m", "strata_jax.export", "--model-json",
                        json.dumps(tiny_model()), "--out", out, "--mesh", mesh], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def tiny_config(steps: int = 30, **model_over: Any) -> dict[str, Any]:
    """A resolved config (model, train, data, seed) for the reference."""
    return {
        "seed": 1234,
        "model": tiny_model(**model_over),
        "train": {"steps": steps, "batch_size": 4, "microbatches": 2, "lr": 3e-3, "min_lr_ratio": 0.1,
                  "warmup_steps": 3, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                  "grad_clip": 1.0, "eval_every": 10, "eval_batches": 1},
        "data": {"val_fraction": 0.1},
    }


class MlirRunner:
    """Compiles bundle program files (the MLIR text the C side reads) with the local
    XLA backend and runs them on numpy arrays: a stand-in for PJRT in C."""

    def __init__(self, bundle_dir: str, manifest: dict[str, Any]) -> None:
        import jax
        import jax.extend.backend
        from jax._src.lib import xla_client as xc

        self._jax = jax
        self._backend = jax.extend.backend.get_backend()
        self._opts = xc.CompileOptions
        self._dir = bundle_dir
        self.programs = {p["name"]: p for p in manifest["programs"]}
        self._exes: dict[str, Any] = {}

    def __call__(self, name: str, *args: np.ndarray) -> list[np.ndarray]:
        if name not in self._exes:
            with open(os.path.join(self._dir, self.programs[name]["file"]), encoding="utf-8") as f:
                text = f.read()
            self._exes[name] = self._backend.compile_and_load(
                text, self._backend.devices()[:1], self._opts())
        spec = self.programs[name]
        assert len(args) == len(spec["inputs"]), name
        bufs = [self._jax.device_put(np.asarray(a)) for a in args]
        return [np.asarray(o) for o in self._exes[name].execute(bufs)]


@pytest.fixture
def mlir_runner_factory() -> Callable[[str, dict[str, Any]], MlirRunner]:
    try:
        import jax
        import jax.extend.backend
        from jax._src.lib import xla_client  # noqa: F401
        jax.extend.backend.get_backend().compile_and_load  # noqa: B018
    except Exception as e:  # noqa: BLE001
        # Not a skip: with the pinned jaxlib this works, and a silent skip would
        # hide the loss of the layer-by-layer checks.
        pytest.fail(f"cannot compile MLIR text with this jaxlib: {e}")
    return MlirRunner
