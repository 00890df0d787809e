"""The monolithic jax.jit anchor over a device mesh (anchor.run(mesh=...),
`python -m strata_jax.anchor --mesh ...`) trains the same model as on one
device: one jit with in/out shardings (batch over data x fsdp, parameters and
optimizer state over fsdp, heads / MLP hidden / vocabulary over tensor), the
collectives inserted by XLA's partitioner.

The meshes need 4 CPU devices, so the runs happen in a child process (this
file as a script, with XLA_FLAGS set) that reports losses as JSON.
Tolerance: every step's loss within rtol 1e-5 of the one-device anchor's (the
same math; reductions such as the data-parallel gradient sum and the
row-parallel matmuls add in another order).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = os.path.join(ROOT, ".venv", "bin", "python")
if not os.path.exists(PY):
    PY = sys.executable
STEPS = 6
# (variant, mesh) pairs the child runs
CASES = (("unroll", "data=2"), ("unroll", "fsdp=2"), ("unroll", "tensor=2"), ("unroll", "data=2,tensor=2"),
         ("scan", "fsdp=2,tensor=2"))
# make test runs fsdp x tensor with the scanned anchor against one device;
# data x tensor with the unrolled one and the one-axis meshes are long drills
# (make test-long). The unrolled anchor on data=2 x tensor=2 still trains in
# make test, through the command line (test_anchor_cli_mesh), and
# reference_train on it against one device (test_reference_train_mesh).
QUICK: tuple[tuple[str, str], ...] = ()  # every meshed anchor is a long drill (tests/README.md)


def _long_session(config: pytest.Config) -> bool:
    expr = config.option.markexpr or ""
    return "long" in expr and "not long" not in expr


def _env(devices: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    return env


def _config(steps: int) -> dict[str, Any]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from conftest import tiny_config

    c = tiny_config(steps=steps, init_std=0.1)
    c["train"]["grad_clip"] = 0.5  # below the early norms: the clip path is exercised
    return c


@pytest.fixture(scope="module")
def child(request: pytest.FixtureRequest) -> dict:
    cases = CASES if _long_session(request.config) else QUICK
    arg = ";".join(f"{v} {m}" for v, m in cases)
    r = subprocess.run([PY, os.path.abspath(__file__), "--child", arg], env=_env(4), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant,mesh", [c if c in QUICK else pytest.param(*c, marks=pytest.mark.long) for c in CASES])
def test_meshed_anchor_matches_one_device(child: dict, variant: str, mesh: str) -> None:
    one = child["one"][variant]
    r = child["mesh"][f"{variant} {mesh}"]
    assert len(one) == STEPS and len(r["losses"]) == STEPS
    np.testing.assert_allclose(r["losses"], one, rtol=1e-5, err_msg=f"{variant} {mesh}")
    # the parameters really lie on the mesh's devices, cut as the rules say
    assert r["param_devices"] == [f"cpu:{i}" for i in range(r["n_devices"])]
    lead = "None, " if variant == "scan" else ""
    f = "'fsdp'" if "fsdp" in mesh else "None"
    t = "'tensor'" if "tensor" in mesh else "None"
    want = {"wq": f"P({lead}{f}, {t})", "w_down": f"P({lead}{t}, {f})",
            "attn_norm": f"P(None, {f})" if lead else f"P({f},)", "wte": f"P({t}, {f})"}
    assert {k: r["param_specs"][k] for k in want} == want


def test_reference_train_mesh(child: dict) -> None:
    one, mesh = child["reference_one"], child["reference_mesh"]
    assert len(mesh["losses"]) == STEPS and len(mesh["eval_losses"]) == len(one["eval_losses"]) >= 1
    np.testing.assert_allclose(mesh["losses"], one["losses"], rtol=1e-5)
    np.testing.assert_allclose([e[1] for e in mesh["eval_losses"]], [e[1] for e in one["eval_losses"]], rtol=1e-5)


def test_anchor_cli_mesh(tmp_path: Any) -> None:
    """--mesh sets JAX's CPU device count itself (no XLA_FLAGS in the child)
    and records the mesh; a malformed mesh is a usage error (exit 2), with
    nothing written."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from strata_jax import data as D

    tok = str(tmp_path / "syn.tok")
    D.write_token_file(tok, D.synthetic_tokens(64), 64)
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(_config(2)))
    out = tmp_path / "r.json"
    cmd = [PY, "-m", "strata_jax.anchor", "--config-json", str(cfg_path), "--tokens", tok, "--variant", "unroll"]
    r = subprocess.run([*cmd, "--mesh", "data=2,tensor=2", "--out", str(out)], env=_env(None), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["mesh"] == {"data": 2, "fsdp": 1, "tensor": 2} and res["steps"] == 2
    assert res["param_devices"] == [f"cpu:{i}" for i in range(4)]
    out2 = tmp_path / "r2.json"
    r = subprocess.run([*cmd, "--mesh", "pipe=2", "--out", str(out2)], env=_env(None), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 2 and "expected axis=size items" in r.stderr and not out2.exists()


def _child() -> None:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from strata_jax import anchor as A
    from strata_jax import data as D
    from strata_jax.parallel import parse_mesh
    from strata_jax.reference_train import load_config, train

    config = load_config(json.dumps(_config(STEPS)))
    tokens = D.synthetic_tokens(64, 4096)
    out: dict[str, Any] = {"one": {}, "mesh": {}}
    wanted = sys.argv[sys.argv.index("--child") + 1].split(";")
    for variant in sorted({v for v, m in CASES if f"{v} {m}" in wanted}):
        r = A.run(config, tokens, variant)
        assert r["param_devices"] == ["cpu:0"], r["param_devices"]
        out["one"][variant] = r["losses"]
    # reference_train.train takes the same mesh (data=2 x tensor=2), eval included
    _, hist = train(config, tokens, mesh=parse_mesh("data=2,tensor=2"))
    out["reference_mesh"] = {"losses": hist["losses"], "eval_losses": hist["eval_losses"]}
    _, hist = train(config, tokens)
    out["reference_one"] = {"losses": hist["losses"], "eval_losses": hist["eval_losses"]}
    for variant, m in CASES:
        if f"{variant} {m}" not in wanted:
            continue
        spec = parse_mesh(m)
        r = A.run(config, tokens, variant, mesh=spec)
        out["mesh"][f"{variant} {m}"] = {"losses": r["losses"], "param_devices": r["param_devices"],
                                         "n_devices": spec.devices, "param_specs": r["param_specs"]}
    print(json.dumps(out))


if __name__ == "__main__" and "--child" in sys.argv:
    _child()
