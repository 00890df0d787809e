"""Shared fixtures: python/ on sys.path, tiny configs, an MLIR-text program runner."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

TINY_MODEL: dict[str, Any] = {
    "vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "seq_len": 16,
    "tie_embeddings": True, "compute_dtype": "f32", "rope_theta": 10000.0, "init_std": 0.02,
    "microbatch_size": 2,
}


def tiny_model(**over: Any) -> dict[str, Any]:
    return {**TINY_MODEL, **over}


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
