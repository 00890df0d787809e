"""Golden numerics: run a case, reduce it to a record, compare two records
with tolerances from rounding-error analysis (tests/golden/README.md).

A record holds, for one fixed-seed run of one case:
- `steps`: every step's loss and global gradient norm (metrics.jsonl);
- `layers`: step 1's per-stage statistics of diag.numerics=layer (RMS and
  largest |x| of every block's output and input gradient, of each stage's
  parameter gradients, updates and parameters; docs/diagnostics.md);
- `tensors`: step 1's dump (diag.dump=step:1) in plan order: forward,
  loss-program and backward outputs, complete gradients and updates, as
  summary statistics (`tensor_stats`): norm, largest |x|, a few fixed-index
  values and a hash of the bf16-rounded tensor.

`compare` walks the dump's tensors in plan order, then the per-stage
statistics (forward outputs up the layers, the loss, the backward down,
gradients, updates), then steps 2..20, and returns every comparison; the
first one over its tolerance is the report's headline (`describe`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cases import BY_NAME, COMMON, Case

ROOT = Path(__file__).resolve().parents[2]
STRATA = ROOT / "build" / "strata"
RECORDS = Path(__file__).resolve().parent / "records"
FORMAT = "strata-golden/1"

# --- tolerances (README.md, "Tolerances") --------------------------------------

U = {"f32": 2.0 ** -24, "bf16": 2.0 ** -8}
# Probabilistic rounding-error bound (Higham & Mary 2019): a sum of n terms in
# any order errs by at most LAMBDA * sqrt(n) * u * sum|terms| except with
# probability 2 exp(-LAMBDA^2 / 2) (1e-21 at LAMBDA = 10).
LAMBDA = 10.0
# exp, log, rsqrt, tanh, erf: a vectorised implementation may differ from
# another instruction set's by a few ulp; TRANSC_ULP each, TRANSC_PER_BLOCK
# of them on a block's chain (forward or backward), 2 on the head's.
TRANSC_ULP = 4
TRANSC_PER_BLOCK = 8
# bf16: tensors rounded to bf16 on a block's chain (matmul inputs, norms' outputs)
BF16_ROUNDINGS_PER_BLOCK = 6


@dataclass
class Shape:
    d: int
    d_ff: int
    seq: int
    heads: int
    experts: int
    vocab: int
    layers: int
    micro_tokens: int
    micro: int
    params: int
    dtype: str

    @staticmethod
    def of(model: dict[str, Any], train: dict[str, Any]) -> "Shape":
        d, dff, L = model["d_model"], model["d_ff"], model["n_layers"]
        kinds = model.get("layers") or [model["block"]] * L
        E = model.get("n_experts", 0) if "moe" in kinds else 0
        V = model.get("vocab_padded") or model["vocab_size"]
        mb = train["batch_size"] // train["microbatches"]
        # an upper bound of the parameter count: embedding (untied head too),
        # positions, each layer's matrices (an MoE layer's experts) and vectors
        per_layer = 4 * d * d + 3 * d * dff * max(1, E) + d * E + 16 * d + 2 * dff
        P = 2 * V * d + model["seq_len"] * d + L * per_layer + 4 * d
        return Shape(d, dff, model["seq_len"], model["n_heads"], E, V, L, mb * model["seq_len"],
                     train["microbatches"], P, "bf16" if model.get("compute_dtype") == "bf16" else "f32")

    @property
    def block_n(self) -> int:
        """The summed contraction lengths along one block's longest chain:
        two norms (d each, gpt2's LayerNorm mean and variance: 2d), the q/k/v
        projection (d), scores (head size), softmax normaliser and
        probabilities x values (2 T), the output projection (d), the MLP
        (d in, d_ff out; 2 d_ff covers an MoE expert and its combine), the
        router and its softmax (d + experts)."""
        return 6 * self.d + self.d // self.heads + 2 * self.seq + 2 * self.d_ff + 2 * self.experts

    @property
    def head_n(self) -> int:
        return 3 * self.d + self.vocab


def chain(shape: Shape, kind: str, layer: int) -> tuple[int, int, int]:
    """(n, transcendental evaluations, blocks traversed) of the chain of sums
    that produces a step-1 quantity. layer: the block (0..L-1), -1 embed, L head."""
    L, B, H = shape.layers, shape.block_n, shape.head_n
    tok = shape.micro_tokens + shape.micro
    if kind == "out":          # block `layer`'s forward output
        blocks = layer + 1
        n = blocks * B
    elif kind == "loss":
        blocks = L
        n = L * B + H + tok
    elif kind == "dx":         # gradient of block `layer`'s input: forward, head, backward down to it
        blocks = 2 * L - layer
        n = blocks * B + H
    else:                      # grad/update/param of a stage: + the sum over tokens and microbatches
        lo = 0 if layer < 0 or layer >= L else layer  # embed and a tied head: the whole backward
        blocks = 2 * L - lo
        n = blocks * B + H + tok
    transc = blocks * TRANSC_PER_BLOCK + 2
    return n, transc, blocks


def rel_tol(shape: Shape, kind: str, layer: int) -> float:
    """The largest relative difference two correct evaluations of a step-1
    quantity may show (norm-like statistics; README.md, "Tolerances")."""
    n, transc, blocks = chain(shape, kind, layer)
    u = U["f32"]
    one = LAMBDA * math.sqrt(n) * u + transc * TRANSC_ULP * u + 4 * u  # + the initial parameters' last bit
    f32 = 2 * one
    if shape.dtype == "f32":
        return f32
    # bf16: a tensor rounded to bf16 differs between two evaluations only
    # where their f32 values straddle a rounding boundary: a fraction
    # p <= f32 / (2 u_bf16) of its elements, each by one bf16 ulp (2 u_bf16
    # relative), i.e. 2 u_bf16 sqrt(p) of the tensor's norm, at every rounding
    # on the chain.
    ub = U["bf16"]
    p = min(1.0, f32 / (2 * ub))
    return f32 + blocks * BF16_ROUNDINGS_PER_BLOCK * 2 * ub * math.sqrt(p)


def sumsq_tol(shape: Shape) -> float:
    """The global gradient norm's own sum: P squares (sqrt halves it, two evaluations double it)."""
    return LAMBDA * math.sqrt(shape.params) * U["f32"]


def step_tol(shape: Shape, what: str, step: int) -> float:
    """Relative tolerance of step |step|'s loss or gradient norm. Each step's
    rounding enters the parameters through its update and adds at most one
    step's budget to what the later steps compute, and nothing amplifies it
    (README.md, "Over 20 steps"): the chain's budget grows linearly with the
    step. The gradient norm's final sum of squares is fresh every step (AdamW
    is invariant to the clip scale it sets, up to eps): not multiplied."""
    if what == "loss":
        return step * rel_tol(shape, "loss", shape.layers)
    return step * rel_tol(shape, "grad", -1) + sumsq_tol(shape)


# --- statistics of one tensor (also src/train/input_stats.c's, issue 30 item 4b) ---


def fixed_indices(n: int) -> list[int]:
    """Flat indices 0, n/3, 2n/3, n-1 (deduplicated): fixed by the size only."""
    return sorted({0, n // 3, (2 * n) // 3, max(n - 1, 0)}) if n else []


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bit patterns, round to nearest even (every NaN 0x7FC0)."""
    f = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    x = f.view(np.uint32).astype(np.uint64)
    r = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF
    r[np.isnan(f)] = 0x7FC0
    return r.astype(np.uint16)


def tensor_stats(a: np.ndarray) -> dict[str, Any]:
    """norm (f64 sum of squares) and largest |x| of the finite elements, the
    count of the others, the values at fixed_indices (None where not
    finite), sha256 of the little-endian bf16-rounded tensor (first 16 hex
    digits). src/train/input_stats.c computes the same for a repro
    package's inputs, bit for bit: both sum the squares in order (cumsum;
    numpy's sum is pairwise and differs in the last bits)."""
    f = np.asarray(a, dtype=np.float64).reshape(-1)
    fin = f[np.isfinite(f)]
    idx = fixed_indices(f.size)
    bits = bf16_bits(np.asarray(a, dtype=np.float32).reshape(-1))
    return {"norm": float(np.sqrt(np.cumsum(fin * fin)[-1])) if fin.size else 0.0,
            "maxabs": float(np.max(np.abs(fin))) if fin.size else 0.0, "nonfinite": int(f.size - fin.size), "idx": idx,
            "values": [float(f[i]) if np.isfinite(f[i]) else None for i in idx],
            "bf16_sha256": hashlib.sha256(bits.astype("<u2").tobytes()).hexdigest()[:16]}


# --- a run -> a record -----------------------------------------------------------

def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout[-3000:]}\n"
                           f"stderr:\n{r.stderr[-3000:]}")
    return r


def run_case(case: Case, out: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """strata train of |case| into out/run, step 1 dumped; its record."""
    env = {**os.environ, **(env or {})}
    over = [*case.overrides, *COMMON, "diag.dump=step:1"]
    resolved = json.loads(_run([str(STRATA), "config", "--json", case.config, *over], env).stdout)
    run_dir = out / "run"
    _run([str(STRATA), "train", case.config, *over, f"run.dir={run_dir}"], env)
    return record_of(case, resolved, run_dir)


def record_of(case: Case, resolved: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "loss" in m and "step" in m]
    first = steps[0]
    layers = []
    for key, v in first.items():
        if not key.startswith("numerics/"):
            continue
        _, stage, rest = key.split("/")
        tensor, stat = rest.rsplit("_", 1)
        row = next((r for r in layers if r["stage"] == stage and r["tensor"] == tensor), None)
        if row is None:
            row = {"stage": stage, "tensor": tensor}
            layers.append(row)
        row[stat] = v
    rec: dict[str, Any] = {
        "format": FORMAT, "case": case.name, "config": case.config, "overrides": case.overrides,
        "model": resolved["model"],
        "train": {k: resolved["train"][k] for k in ("batch_size", "microbatches", "lr", "optimizer", "grad_clip")},
        "kernels": resolved.get("kernels", {}),
        "steps": [{"step": m["step"], "loss": m["loss"], "grad_norm": m["grad_norm"], "lr": m["lr"]} for m in steps],
        "layers": layers,
    }
    dump_dir = run_dir / "dump" / "step_1"
    if (dump_dir / "index.json").exists():
        rec["tensors"] = dump_stats(dump_dir, Shape.of(rec["model"], rec["train"]))
    return rec


def _row(e: dict[str, Any], t: dict[str, Any], a: np.ndarray, cls: str) -> dict[str, Any]:
    row = {"seq": e["seq"], "program": e["program"], "stage": e["stage"], "layer": e["layer"], "micro": e["micro"],
           "phase": e["phase"],
           "name": t["name"], "class": cls, "dtype": t["dtype"], "shape": t["shape"]}
    row.update(tensor_stats(a))
    return row


def _update_row(shape: Shape, e: dict[str, Any], t: dict[str, Any], tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    """An optimizer update (new minus old parameter) with its tolerances,
    from the launch's own inputs: AdamW's first step is
    lr (g/(|g|+eps) + wd p) with g the clipped gradient, which is not smooth
    where |g| is near 0: an element whose gradient is within rounding of 0 may
    flip its sign (2 lr), the others move by lr eps dg/(|g|-dg+eps)^2; and
    the new parameter is rounded to f32, so new - old is known to one ulp of
    the parameter (README.md, "Updates")."""
    ins = {x["name"]: x for x in e["tensors"] if x["io"] == "in"}
    old = tensors[ins[t["name"]]["key"]].astype(np.float64)
    new = tensors[t["key"]].astype(np.float64)
    row = _row(e, t, new - old, "update")
    g = tensors[ins["grad_" + t["name"]]["key"]].astype(np.float64).reshape(-1)
    lr = float(tensors[ins["lr"]["key"]])
    gscale = float(tensors[ins["gscale"]["key"]])
    eps = float(tensors[ins["hyper"]["key"]].reshape(-1)[2])
    grads = [tensors[x["key"]] for x in e["tensors"] if x["io"] == "in" and x["class"] == "gradient"]
    scale_g = max(float(np.sqrt(np.mean(np.square(x.astype(np.float64))))) for x in grads)
    layer = e["layer"] if e["layer"] >= 0 else -1
    # the clip scale errs as the global norm does
    a = gscale * np.abs(g)
    da = gscale * (rel_tol(shape, "grad", layer) * np.maximum(np.abs(g), scale_g)
                   + step_tol(shape, "grad_norm", 1) * np.abs(g))
    smooth = lr * eps * da / np.square(np.maximum(a - da, 0.0) + eps)
    # + the update's own arithmetic (a few roundings), and the new parameter
    # is rounded to f32: new - old is known to one ulp of the parameter
    du = np.where(a <= da, 2 * lr, smooth) + 8 * U["f32"] * np.abs((new - old).reshape(-1)) + \
        2 * U["f32"] * np.maximum(np.abs(old), np.abs(new)).reshape(-1)
    row["norm_tol"] = float(np.sqrt(np.sum(du * du)))
    row["maxabs_tol"] = float(np.max(du)) if du.size else 0.0
    row["value_tols"] = [float(du[i]) for i in row["idx"]]
    return row


_ST_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
              "BF16": np.uint16, "F16": np.float16}


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file's tensors; bf16 widened to f32 exactly (numpy has
    no bf16, and the safetensors package's numpy loader refuses it)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        lo, hi = h["data_offsets"]
        a = np.frombuffer(raw[base + lo:base + hi], dtype=np.dtype(_ST_DTYPES[h["dtype"]]).newbyteorder("<"))
        if h["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.reshape(h["shape"])
    return out


def dump_stats(dump_dir: Path, shape: Shape) -> list[dict[str, Any]]:
    """Step 1 from its dump, in plan order: microbatch 0's forward outputs
    (block outputs and residuals), loss-program and backward outputs, each
    parameter group's complete gradient (the last accumulation, or the
    backward's with one microbatch) and each parameter's update."""
    index = json.loads((dump_dir / "index.json").read_text())
    tensors = load_safetensors(dump_dir / "tensors.safetensors")
    entries = index["entries"]
    # a gradient's last accumulation is the complete one (a tied embedding's
    # is accumulated from the embedding's and the head's backward)
    last_accum = {}
    for e in entries:
        if e["phase"] == "accum":
            for t in e["tensors"]:
                if t["io"] == "out":
                    last_accum[(e["stage"], e["layer"], t["name"])] = e["seq"]
    out = []
    for e in entries:
        ph = e["phase"]
        if not ((ph in ("fwd", "loss", "bwd") and e["micro"] == 0) or ph in ("accum", "update")):
            continue
        for t in e["tensors"]:
            if t["io"] != "out" or t["dtype"] not in ("f32", "bf16"):
                continue
            if ph == "accum" and last_accum[(e["stage"], e["layer"], t["name"])] != e["seq"]:
                continue
            if ph == "update":
                if t["class"] == "param_updated":
                    out.append(_update_row(shape, e, t, tensors))
                continue
            out.append(_row(e, t, tensors[t["key"]], t["class"]))
    return out


def provenance() -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"commit": commit, "machine": platform.machine(), "cpu": cpu,
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "STRATA_KERNELS_ISA": os.environ.get("STRATA_KERNELS_ISA", "")}


def load(name: str) -> dict[str, Any]:
    return json.loads((RECORDS / f"{name}.json").read_text())


def save(rec: dict[str, Any]) -> Path:
    RECORDS.mkdir(parents=True, exist_ok=True)
    p = RECORDS / f"{rec['case']}.json"
    # one line a step, stage or tensor: small diffs when a record changes
    parts = []
    for k, v in rec.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            body = ",\n".join("  " + json.dumps(x) for x in v)
            parts.append(f" {json.dumps(k)}: [\n{body}\n ]")
        else:
            parts.append(f" {json.dumps(k)}: {json.dumps(v)}")
    p.write_text("{\n" + ",\n".join(parts) + "\n}\n")
    return p


# --- comparing two records -------------------------------------------------------

@dataclass
class Check:
    where: str        # "step 1, layer 2 (moe), out" / "step 7"
    stage: str        # embed | layer<l> | head | "" (whole model)
    tensor: str       # out, dx, grad, update, param, loss, grad_norm, or a program tensor's name
    stat: str         # rms, maxabs, norm, value[i], nonfinite, loss, grad_norm
    want: float
    got: float
    tol: float        # absolute
    info: str = ""    # the hash changed, etc.

    @property
    def diff(self) -> float:
        if math.isnan(self.want) and math.isnan(self.got):
            return 0.0
        return abs(self.got - self.want)

    @property
    def ok(self) -> bool:
        return self.diff <= self.tol

    @property
    def rel(self) -> float:
        return self.diff / abs(self.want) if self.want else (0.0 if self.diff == 0 else math.inf)

    def line(self) -> str:
        return (f"{self.where}: {self.stat} {self.got:.9g} vs recorded {self.want:.9g}: |diff| {self.diff:.3g} "
                f"(relative {self.rel:.3g}), tolerance {self.tol:.3g}{' ' + self.info if self.info else ''}")


def _stage_layer(stage: str, L: int) -> int:
    return -1 if stage == "embed" else L if stage == "head" else int(stage.removeprefix("layer"))


def _stage_name(stage: str, kinds: list[str]) -> str:
    if stage.startswith("layer"):
        l = int(stage.removeprefix("layer"))
        return f"layer {l} ({kinds[l]})" if l < len(kinds) else stage
    return stage


# the plan's order of step 1: forward outputs, loss, backward, gradients, updates
_ORDER = {"out": 0, "loss": 1, "dx": 2, "grad": 3, "grad_norm": 4, "update": 5, "param": 6}


def compare(want: dict[str, Any], got: dict[str, Any]) -> list[Check]:
    """Every comparison of |got| against the recorded |want|, in plan order."""
    model = want["model"]
    shape = Shape.of(model, want["train"])
    L = model["n_layers"]
    kinds = model.get("layers") or [model["block"]] * L
    # the dump's tensors (plan order) first: they name the program and tensor
    checks: list[Check] = _compare_tensors(want, got, shape)
    w1, g1 = want["steps"][0], got["steps"][0]
    rows = []
    for r in want["layers"]:
        layer = _stage_layer(r["stage"], L)
        # the forward goes up the layers, the backward down
        pos = layer if r["tensor"] == "out" else -layer
        rows.append((_ORDER[r["tensor"]], pos, r))
    rows.append((_ORDER["loss"], 0, {"stage": "", "tensor": "loss"}))
    rows.append((_ORDER["grad_norm"], 0, {"stage": "", "tensor": "grad_norm"}))
    got_layers = {(r["stage"], r["tensor"]): r for r in got["layers"]}
    for _, _, r in sorted(rows, key=lambda x: (x[0], x[1])):
        if r["tensor"] in ("loss", "grad_norm"):
            t = step_tol(shape, r["tensor"], 1)
            checks.append(Check(f"step 1, {r['tensor']}", "", r["tensor"], r["tensor"], w1[r["tensor"]],
                                g1[r["tensor"]], t * abs(w1[r["tensor"]])))
            continue
        layer = _stage_layer(r["stage"], L)
        kind = r["tensor"] if r["tensor"] in ("out", "dx") else "grad"
        t = rel_tol(shape, kind, layer)
        g = got_layers.get((r["stage"], r["tensor"]), {})
        where = f"step 1, {_stage_name(r['stage'], kinds)}, {r['tensor']}"
        for stat in ("rms", "maxabs", "nonfinite"):
            if stat not in r:
                continue
            tol = 0.0 if stat == "nonfinite" else t * abs(r[stat])
            checks.append(Check(where, r["stage"], r["tensor"], stat, r[stat], g.get(stat, math.nan), tol))
    for w, g in zip(want["steps"][1:], got["steps"][1:]):
        k = w["step"]
        for key in ("loss", "grad_norm"):
            checks.append(Check(f"step {k}, {key}", "", key, key, w[key], g[key], step_tol(shape, key, k) * abs(w[key])))
    if len(got["steps"]) != len(want["steps"]):
        checks.append(Check("steps", "", "steps", "count", len(want["steps"]), len(got["steps"]), 0.0))
    return checks


_DUMP_CHAIN = {"activation": "out", "loss": "loss", "gradient": "grad", "activation_grad": "dx", "update": "grad"}


def _compare_tensors(want: dict[str, Any], got: dict[str, Any], shape: Shape) -> list[Check]:
    """The step dump's tensors, in the dump's (plan) order."""
    if "tensors" not in want or "tensors" not in got:
        return []
    L = want["model"]["n_layers"]
    kinds = want["model"].get("layers") or [want["model"]["block"]] * L
    # matched by what a tensor is, not by the program's name (block_fwd or
    # block_fwd_res as remat decides; adamw_stats_<group> or a renamed update)
    key = lambda r: (r["phase"], r["stage"], r["layer"], r["micro"], r["name"])  # noqa: E731
    got_rows = {key(r): r for r in got["tensors"]}
    # The scale of an element's summed magnitudes: the largest RMS among its
    # launch's outputs of its class (a gradient that cancels to ~0 is a sum of
    # terms the size of the other gradients: gpt2's key bias).
    launch_rms: dict[tuple, float] = {}
    for r in want["tensors"]:
        k = (r["seq"], r["class"])
        launch_rms[k] = max(launch_rms.get(k, 0.0), r["norm"] / math.sqrt(max(1, math.prod(r["shape"]))))
    out = []
    for r in want["tensors"]:
        g = got_rows.get(key(r))
        layer = r["layer"]
        stage = f"layer{layer}" if r["stage"] == "block" else r["stage"]
        where = f"step 1, {r['program']}" + (f", layer {layer} ({kinds[layer]})" if stage.startswith("layer") else "") + \
            (f", micro {r['micro']}" if r["micro"] >= 0 else "") + f", {r['name']} ({r['class']})"
        if g is None:
            out.append(Check(where, stage, r["name"], "missing", 0.0, math.nan, 0.0))
            continue
        chain_layer = layer if stage.startswith("layer") else (-1 if stage == "embed" else L)
        t = rel_tol(shape, _DUMP_CHAIN.get(r["class"], "grad"), chain_layer)
        n = max(1, math.prod(r["shape"]))
        scale = launch_rms[(r["seq"], r["class"])]
        info = "" if g["bf16_sha256"] == r["bf16_sha256"] else "(its bf16 hash changed too)"
        upd = r["class"] == "update"
        out.append(Check(where, stage, r["name"], "norm", r["norm"], g["norm"],
                         r["norm_tol"] if upd else t * (r["norm"] + math.sqrt(n) * scale), info))
        out.append(Check(where, stage, r["name"], "maxabs", r["maxabs"], g["maxabs"],
                         r["maxabs_tol"] if upd else t * max(r["maxabs"], scale), info))
        tols = r["value_tols"] if upd else [t * max(abs(v), scale) for v in r["values"]]
        for i, wv, gv, tol in zip(r["idx"], r["values"], g["values"], tols):
            out.append(Check(where, stage, r["name"], f"value[{i}]", wv, gv, tol, info))
    return out


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]


def describe(name: str, checks: list[Check]) -> str:
    """The first comparison over its tolerance, then the others by place."""
    bad = failures(checks)
    if not bad:
        worst = max(checks, key=lambda c: c.diff / c.tol if c.tol else (0 if c.diff == 0 else math.inf))
        used = worst.diff / worst.tol if worst.tol else 0.0
        return f"{name}: {len(checks)} comparisons within tolerance (largest use {used:.2g} of its budget: {worst.where} {worst.stat})"
    lines = [f"{name}: {len(bad)} of {len(checks)} comparisons over tolerance; first: {bad[0].line()}"]
    by_where: dict[str, list[Check]] = {}
    for c in bad[1:]:
        by_where.setdefault(c.where, []).append(c)
    for where, cs in list(by_where.items())[:12]:
        lines.append(f"  then {where}: {', '.join(c.stat for c in cs)} (worst relative {max(c.rel for c in cs):.3g})")
    if len(by_where) > 12:
        lines.append(f"  ... and {len(by_where) - 12} more places")
    return "\n".join(lines)


