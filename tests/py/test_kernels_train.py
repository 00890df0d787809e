"""Training equivalence of the kernel implementations (docs/kernels.md):
strata trains the tiny model 30 steps with kernels.*=ffi (rmsnorm, swiglu,
cross_entropy, attention) and with the xla
reference, from the same seed and data; every step's loss agrees within rtol
1e-4 and the final parameters within rtol 1e-3 / atol 1e-5. The same for
pallas (interpret mode) on a 2-layer model, 5 steps, and for the ffi
cross-entropy on a padded vocabulary (model.vocab_padded).

Overrides for CPU speed: synthetic data, sequence 64, batch 8, no eval, no
checkpoints; the architecture is configs/tiny.yml's. sched.remat=every:2 (in
both runs of a pair) so that every other layer recomputes its forward in the
backward (block_bwd: the kernels' custom_vjp) and the others keep residuals
(block_fwd_res / block_bwd_res: e.g. attention's forward and backward
targets called directly)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")
# Every op at xla first (the default, kernels.<op>=auto, is ffi on the CPU
# plugin): the reference run is the xla one, and each case's overrides,
# which come after, select what it tests.
XLA = ["kernels.rmsnorm=xla", "kernels.swiglu=xla", "kernels.cross_entropy=xla", "kernels.attention=xla"]
COMMON = [*XLA, "data.synthetic=true", "model.seq_len=64", "train.batch_size=8", "train.eval_every=0", "ckpt.every=0",
          "run.progress=off", "obs.tensorboard=false"]
CASES = {
    "ffi": (["train.steps=30", "sched.remat=every:2"],
            ["kernels.rmsnorm=ffi", "kernels.swiglu=ffi", "kernels.cross_entropy=ffi", "kernels.attention=ffi"]),
    "pallas": (["train.steps=5", "model.n_layers=2", "sched.remat=every:2"],
               ["kernels.rmsnorm=pallas", "kernels.swiglu=pallas", "kernels.cross_entropy=pallas",
                "kernels.attention=pallas"]),
    # A padded vocabulary (gpt2's model.vocab_padded): the padding ids' -1e30
    # logits go through the cross-entropy kernel and must weigh nothing.
    "ffi-padded": (["train.steps=5", "model.n_layers=2", "model.vocab_padded=300"], ["kernels.cross_entropy=ffi"]),
}


def _train(tmp: Path, name: str, over: list[str]) -> Path:
    run_dir = tmp / name
    r = subprocess.run([STRATA, "train", "configs/tiny.yml", *over, f"run.dir={run_dir}"], cwd=ROOT,
                       capture_output=True, text=True, env={**os.environ, "STRATA_CACHE_DIR": str(tmp / "cache")})
    if r.returncode != 0:
        raise AssertionError(f"strata train {' '.join(over)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return run_dir


def _losses(run_dir: Path) -> np.ndarray:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return np.array([r["loss"] for r in rows if "loss" in r])


# ffi-padded is a long drill (make test-long): test_gpt2.py's
# test_gpt2_padded_vocabulary_through_the_ffi_cross_entropy keeps a padded
# vocabulary through the ffi cross-entropy in make test.
# pallas (interpret mode) training is a long drill too: test_kernels.py keeps
# every pallas kernel against the reference, forward and backward, and the
# residual paths through it in whole blocks.
# ffi itself (every op's C kernel through 20 trained steps against xla) is
# a long drill too since issue 30: make test trains the C kernels in the
# golden cases (llama-tiny-gqa, moe-tiny, llama-mix-tiny at kernels auto,
# each step against its record), compares ffi attention with xla tensor by
# tensor (test_compare.py), and verifies every kernel (test_kernels.sh).
@pytest.fixture(scope="module", params=[pytest.param(c, marks=pytest.mark.long) if c in ("ffi", "ffi-padded", "pallas")
                                        else c for c in sorted(CASES)])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    if not os.path.exists(STRATA):
        raise AssertionError(f"{STRATA} is missing: run `make build` first (make test does)")
    tmp = tmp_path_factory.mktemp("kernels-" + request.param)
    base, kern = CASES[request.param]
    ref = _train(tmp, "xla", COMMON + base)
    got = _train(tmp, request.param, COMMON + base + kern)
    # The pair compares what it says: the reference at xla for every op, the
    # other run at the case's implementations (and xla for the rest).
    want = {op: "xla" for op in ("rmsnorm", "swiglu", "cross_entropy", "attention")}
    ctx = {d: json.loads((d / "context.json").read_text())["kernels"] for d in (ref, got)}
    assert {op: ctx[ref][op] for op in want} == want, ctx[ref]
    asked = dict(k.removeprefix("kernels.").split("=") for k in kern)
    assert {op: ctx[got][op] for op in want} == {**want, **asked}, ctx[got]
    return request.param, ref, got


def test_every_step_loss_matches(runs: tuple[str, Path, Path]) -> None:
    impl, ref, got = runs
    a, b = _losses(ref), _losses(got)
    assert len(a) == len(b) == (30 if impl == "ffi" else 5)
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=0)
    assert a[-1] < a[0]  # it trained


def test_final_parameters_match(runs: tuple[str, Path, Path]) -> None:
    _, ref, got = runs
    pa, pb = load_file(str(ref / "params.safetensors")), load_file(str(got / "params.safetensors"))
    assert sorted(pa) == sorted(pb)
    for k in pa:
        np.testing.assert_allclose(pb[k], pa[k], rtol=1e-3, atol=1e-5, err_msg=k)


def test_the_run_used_the_kernels(runs: tuple[str, Path, Path]) -> None:
    case, ref, got = runs
    want = {k.split("=")[0][len("kernels."):]: k.split("=")[1] for k in CASES[case][1]}
    ctx = json.loads((got / "context.json").read_text())["kernels"]
    assert {op: ctx[op] for op in want} == want
    assert json.loads((ref / "context.json").read_text())["kernels"]["cross_entropy"] == "xla"
    bundles = [json.loads(line) for line in (got / "events.jsonl").read_text().splitlines()]
    ev = [e for e in bundles if e.get("event") == "bundle" or e.get("type") == "bundle"]
    assert ev and "kernel_fallbacks" not in ev[0]
    assert {op: ev[0]["kernels"][op] for op in want} == want
