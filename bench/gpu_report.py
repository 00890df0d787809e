"""Driver of bench/gpu.sh: strata against the two monolithic anchors on one
GPU, bf16, a larger preset, with MFU against a measured bf16 matmul peak.

    python bench/gpu_report.py --out DIR [--strata PATH] [--plugin CUDA_PLUGIN]
        [--steps N] [--budget-s S] [--dry-run]

Every measurement runs in its own process, one after the other (a JAX
process reserves most of the GPU's memory while it lives). Parts that fail
are reported as failed and the rest still runs; parts that would not fit in
--budget-s are skipped and reported as skipped.

--dry-run: CPU, configs/test.yml in bf16, a 512 matmul "peak": checks the
plumbing on a machine without a GPU (tests/py/test_bench.py runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import flops as FL  # noqa: E402
import run as R  # noqa: E402

# The larger preset: ~0.5 B parameters, 8 x 1024 tokens a step, bf16 matmuls.
GPU_CONFIG = "configs/small.yml"
GPU_OVERRIDES = ["model.d_model=2048", "model.n_heads=16", "model.d_ff=8192", "model.n_layers=8",
                 "model.seq_len=1024", "train.batch_size=8", "train.microbatches=1", "model.compute_dtype=bf16",
                 "data.synthetic=true"]
DRY_CONFIG = "configs/test.yml"
DRY_OVERRIDES = ["model.compute_dtype=bf16", "data.synthetic=true"]
COMMON = ["train.eval_every=0", "train.eval_batches=1"]

# Defaults of configs/base.yml the anchor needs, for when strata could not be
# built on the GPU machine (then `strata config --json` is not available).
BASE = {
    "seed": 0,
    "model": {"vocab_size": 256, "d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512, "seq_len": 128,
              "tie_embeddings": True, "compute_dtype": "f32", "rope_theta": 10000.0, "init_std": 0.02},
    "train": {"steps": 100, "batch_size": 8, "microbatches": 1, "lr": 0.003, "min_lr_ratio": 0.1,
              "warmup_steps": 10, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
              "grad_clip": 1.0, "eval_every": 50, "eval_batches": 4},
    "data": {"synthetic": True, "val_fraction": 0.05},
}
SMALL = {"model": {"d_model": 256, "n_layers": 8, "n_heads": 8, "d_ff": 1024, "seq_len": 256},
         "train": {"steps": 200, "batch_size": 8}}
TEST = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "seq_len": 16},
        "train": {"steps": 10, "batch_size": 4, "microbatches": 2, "eval_every": 5, "eval_batches": 1}}

MATMUL_SCRIPT = r"""
import json, sys, time
import jax, jax.numpy as jnp
sizes = [int(s) for s in sys.argv[1].split(",")]
out = {"backend": jax.default_backend(), "device": str(jax.devices()[0]), "sizes": {}}
for n in sizes:
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = jax.random.normal(kb, (n, n), jnp.bfloat16)
    # bf16 operands, f32 accumulation and result: what the model's matmuls do.
    f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    f(a, b).block_until_ready()
    reps, best = 0, float("inf")
    t_end = time.perf_counter() + 3.0
    while reps < 50 and time.perf_counter() < t_end:
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    out["sizes"][str(n)] = {"best_s": best, "reps": reps, "tflops": 2 * n**3 / best / 1e12}
out["peak_tflops"] = max(v["tflops"] for v in out["sizes"].values())
print(json.dumps(out))
"""


def apply_overrides(cfg: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for o in overrides:
        key, _, val = o.partition("=")
        sect, _, name = key.partition(".")
        if not name or sect not in cfg:
            continue  # run.*, runtime.*: not the anchor's business
        old = cfg[sect].get(name)
        if isinstance(old, bool):
            cfg[sect][name] = val == "true"
        elif isinstance(old, int):
            cfg[sect][name] = int(val)
        elif isinstance(old, float):
            cfg[sect][name] = float(val)
        else:
            cfg[sect][name] = val
    return cfg


def fallback_config(dry: bool, overrides: list[str]) -> dict[str, Any]:
    cfg = json.loads(json.dumps(BASE))
    for sect, vals in (TEST if dry else SMALL).items():
        cfg[sect].update(vals)
    return apply_overrides(cfg, overrides)


class Report:
    def __init__(self, budget_s: float) -> None:
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.res: dict[str, Any] = {"parts": {}}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def log(self, msg: str) -> None:
        print(f"[gpu {time.monotonic() - self.t0:5.0f}s] {msg}", file=sys.stderr, flush=True)

    def part(self, name: str, need_s: float, fn: Any) -> Any:
        if self.left() < need_s:
            self.res["parts"][name] = {"status": "skipped", "why": f"{self.left():.0f} s of budget left, needs ~{need_s:.0f} s"}
            self.log(f"{name}: skipped (budget)")
            return None
        self.log(f"{name}")
        t = time.monotonic()
        try:
            v = fn()
            self.res["parts"][name] = {"status": "ok", "seconds": round(time.monotonic() - t, 1)}
            return v
        except Exception as e:  # noqa: BLE001 - report and go on
            self.res["parts"][name] = {"status": "failed", "seconds": round(time.monotonic() - t, 1),
                                       "error": str(e)[-3000:]}
            self.log(f"{name}: FAILED: {str(e)[-500:]}")
            return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the JSON and Markdown results")
    ap.add_argument("--strata", default="", help="strata binary; empty: anchors only")
    ap.add_argument("--plugin", default="", help="PJRT plugin for strata (runtime.plugin)")
    ap.add_argument("--steps", type=int, default=0, help="steps per step-time run (default 25; dry run 8)")
    ap.add_argument("--warmup", type=int, default=0, help="warm-up steps left out (default 5; dry run 2)")
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    steps = a.steps or (8 if a.dry_run else 25)
    warmup = a.warmup or (2 if a.dry_run else 5)
    config, overrides = (DRY_CONFIG, DRY_OVERRIDES) if a.dry_run else (GPU_CONFIG, GPU_OVERRIDES)
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="strata-gpu-")
    rep = Report(a.budget_s)
    res = rep.res
    res.update({"schema": 1, "dry_run": a.dry_run, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                "host": platform.node(), "config": config, "overrides": overrides, "steps": steps,
                "warmup": warmup, "strata": a.strata or None, "plugin": a.plugin or None})
    strata_over = [*overrides, *COMMON] + ([f"runtime.plugin={a.plugin}"] if a.plugin else [])
    b = R.Bench(R.QUICK, work, rep.log, strata=a.strata or "/nonexistent")
    b.env.pop("JAX_PLATFORMS", None)
    # Sequential processes on one GPU: do not let a JAX process take 75 % of
    # its memory up front (it is given back at exit, but be explicit).
    b.env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if a.plugin:
        b.env["STRATA_PJRT_PLUGIN"] = a.plugin
    # The exporter runs under this interpreter (there may be no .venv there).
    b.env.setdefault("STRATA_PYTHON", sys.executable)

    # 1. the bf16 matmul peak
    def peak() -> dict[str, Any]:
        sizes = "256,512" if a.dry_run else "4096,8192,16384"
        r = subprocess.run([sys.executable, "-c", MATMUL_SCRIPT, sizes], cwd=ROOT, env=b.env, capture_output=True,
                           text=True, timeout=max(30, rep.left()))
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        return json.loads(r.stdout.strip().splitlines()[-1])
    res["matmul"] = rep.part("matmul_peak", 20, peak)

    # 2. the resolved config and the token file both sides train on
    have_strata = bool(a.strata) and os.access(a.strata, os.X_OK)
    cfg_json = os.path.join(work, "config.json")
    tok = os.path.join(work, "tokens.tok")

    def inputs() -> dict[str, Any]:
        if have_strata:
            cfg = R.resolved_config(b, config, strata_over)
            r = subprocess.run([a.strata, "data", config, *strata_over], cwd=ROOT, env=b.env, capture_output=True,
                               text=True)
            if r.returncode != 0:
                raise RuntimeError(f"strata data failed: {r.stderr.strip()}")
            shutil.copy(r.stdout.splitlines()[0], tok)
        else:
            cfg = fallback_config(a.dry_run, overrides)
            sys.path.insert(0, os.path.join(ROOT, "python"))
            from strata_jax import data as D
            D.write_token_file(tok, D.synthetic_tokens(int(cfg["model"]["vocab_size"])),
                               int(cfg["model"]["vocab_size"]))
        with open(cfg_json, "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        return cfg
    cfg = rep.part("inputs", 5, inputs)
    if cfg is None:
        return finish(a.out, res, rep)
    res["model_flops_per_step"] = FL.step_flops(cfg)

    # 3. strata: cold start + steps, then a warm start
    if have_strata:
        def strata_steps() -> dict[str, Any]:
            r = b.strata_train(config, [*strata_over, f"train.steps={steps}"], "strata-cold",
                               timeout_s=max(30, rep.left()))
            ev = R.events_by_name(r["events"])
            s = R.strata_step_summary(r["metrics"], warmup)
            s.update({"startup_s": ev.get("run", {}).get("startup_seconds"),
                      "compile_s": ev.get("compile", {}).get("seconds"), "maxrss_bytes": r["proc"].maxrss_bytes,
                      "device": ev.get("init", {}).get("context", {}).get("devices"),
                      # where a GPU cold start goes, program by program (one shot at a lent machine)
                      "program_seconds": ev.get("compile", {}).get("program_seconds"),
                      "program_from_cache": ev.get("compile", {}).get("program_from_cache"),
                      "autotune_cache_dir": ev.get("compile", {}).get("autotune_cache_dir"),
                      "compile_threads": ev.get("compile", {}).get("threads"),
                      # host RSS by category at the sampled peak (docs/performance.md, "Where the memory goes")
                      "memory_peak": next((e for e in r["events"] if e.get("event") == "memory"
                                           and e.get("phase") == "peak"), None)})
            return s
        res["strata"] = rep.part("strata_cold_and_steps", 60, strata_steps)

        def strata_warm() -> dict[str, Any]:
            r = b.strata_train(config, [*strata_over, "train.steps=1"], "strata-warm", stop_at_run=True,
                               timeout_s=max(30, rep.left()))
            ev = R.events_by_name(r["events"])
            return {"startup_s": ev.get("run", {}).get("startup_seconds"),
                    "cache_hits": ev.get("compile", {}).get("cache_hits")}
        res["strata_warm"] = rep.part("strata_warm_start", 20, strata_warm)
    else:
        res["parts"]["strata"] = {"status": "skipped", "why": f"no strata binary ({a.strata or 'not built'})"}

    # 4. the anchors
    for v in ("unroll", "scan"):
        def anchor(v: str = v) -> dict[str, Any]:
            r = b.anchor(None, [], v, f"anchor-{v}", steps, inputs=(cfg_json, tok), timeout_s=max(30, rep.left()))
            x = r["result"]
            t = x["step_time_s"][warmup:]
            return {"lower_s": x["lower_s"], "compile_s": x["compile_s"], "median_s": R.median(t), "n": len(t),
                    "client": x.get("client"), "devices": x.get("devices"),
                    "xla_peak_bytes_estimate": (x.get("memory") or {}).get("peak_bytes_estimate"),
                    "maxrss_bytes": r["proc"].maxrss_bytes}
        res[v] = rep.part(f"anchor_{v}", 45, anchor)

    # 5. bench/run.py's parallel section over this machine's devices: strata
    # on the meshes gpu_meshes picks for the device count, against the
    # anchor jitted over the same mesh. The dry run uses 4 CPU devices.
    if have_strata:
        n = 4 if a.dry_run else device_count(b.env)
        meshes = gpu_meshes(n)
        if len(meshes) < 2:
            res["parts"]["parallel"] = {"status": "skipped", "why": f"{n} device(s): a mesh needs at least 2"}
        else:
            pp = R.ParallelPreset(config, [*overrides, *(["train.batch_size=8"] if a.dry_run else [])],
                                  steps=steps, warmup=warmup, meshes=meshes, rounds=1,
                                  cpu_devices=4 if a.dry_run else 0,
                                  strata_overrides=[f"runtime.plugin={a.plugin}"] if a.plugin else [])
            b.plan = dataclasses.replace(b.plan, parallel=pp)
            res["parallel"] = rep.part("parallel", 90, lambda: R.section_parallel(b))
            if res["parallel"] is not None:
                res["parallel"]["devices"] = n
    return finish(a.out, res, rep)


def gpu_meshes(n: int) -> list[str]:
    """The parallel section's meshes on n devices: one device, parallel.data
    = 2, 4, 8 as far as the devices go, and fsdp=2 and tensor=2 from 2
    devices on (one of each is enough to see the collectives work; the
    wider ones cost a bundle export each)."""
    return [*(str(d) if d == 1 else f"data={d}" for d in (1, 2, 4, 8) if d <= n),
            *(["fsdp=2", "tensor=2"] if n >= 2 else [])]


def device_count(env: dict[str, str]) -> int:
    """Devices of JAX's default backend (the GPUs), in a child: this process never imports jax."""
    r = subprocess.run([sys.executable, "-c", "import jax; print(jax.device_count())"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=180)
    try:
        return int(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


def mfu(flops: float | None, step_s: float | None, peak_tflops: float | None) -> float | None:
    if not flops or not step_s or not peak_tflops:
        return None
    return flops / step_s / (peak_tflops * 1e12)


def markdown(res: dict[str, Any]) -> str:
    peak = (res.get("matmul") or {}).get("peak_tflops")
    flops = res.get("model_flops_per_step")
    head = (f"## GPU {'dry run (CPU) ' if res['dry_run'] else ''}{res['date']} on {res['host']}\n\n"
            f"{res['config']} {' '.join(res['overrides'])}; {res['steps']} steps, median after {res['warmup']}; "
            f"model {fmt_tflop(flops)} per step; measured bf16 matmul peak "
            f"{R.fmt(peak, ' TFLOP/s')} on {(res.get('matmul') or {}).get('device', '?')}\n")
    rows = []
    s = res.get("strata") or {}
    ref = {v: (res.get(v) or {}).get("median_s") for v in ("unroll", "scan")}
    if s:
        rows.append(["strata", R.fmt((s.get("median_s") or 0) * 1e3, " ms"),
                     R.fmt(mfu(flops, s.get("median_s"), peak)), "1",
                     f"cold {R.fmt(s.get('startup_s'), ' s')} (XLA {R.fmt(s.get('compile_s'), ' s')}), "
                     f"warm {R.fmt((res.get('strata_warm') or {}).get('startup_s'), ' s')}",
                     R.fmt_bytes(s.get("peak_live_bytes")), R.fmt_bytes(s.get("maxrss_bytes"))])
    for v in ("unroll", "scan"):
        x = res.get(v) or {}
        if not x:
            continue
        rows.append([v, R.fmt((x.get("median_s") or 0) * 1e3, " ms"), R.fmt(mfu(flops, x.get("median_s"), peak)),
                     R.fmt(R.ratio(s.get("median_s"), ref[v])),
                     f"lower {R.fmt(x.get('lower_s'), ' s')} + compile {R.fmt(x.get('compile_s'), ' s')}",
                     R.fmt_bytes(x.get("xla_peak_bytes_estimate")), R.fmt_bytes(x.get("maxrss_bytes"))])
    body = R.md_table(["run", "step (median)", "MFU", "strata / this", "start-up / compile", "device bytes",
                       "peak RSS"], rows) if rows else "(no step-time results)"
    parts = "\n".join(f"- {k}: {v['status']}" + (f" ({v.get('why') or v.get('error', '')[:300]})"
                                                   if v["status"] != "ok" else f" ({v.get('seconds')} s)")
                      for k, v in res["parts"].items())
    par = "\n".join(R.parallel_markdown(res["parallel"])) + "\n" if res.get("parallel") else ""
    return f"{head}\n{body}\n\n{parts}\n" + (f"\n{par}" if par else "")


def fmt_tflop(x: Any) -> str:
    return f"{x / 1e12:.3g} TFLOP" if isinstance(x, (int, float)) else "–"


def finish(out: str, res: dict[str, Any], rep: Report) -> int:
    res["seconds"] = round(time.monotonic() - rep.t0, 1)
    md = markdown(res)
    stem = f"gpu-{'dry-' if res['dry_run'] else ''}{datetime.date.today().isoformat()}-{platform.node() or 'host'}"
    with open(os.path.join(out, stem + ".json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1, default=str)
        f.write("\n")
    with open(os.path.join(out, stem + ".md"), "w", encoding="utf-8") as f:
        f.write(md)
    print(md)
    failed = [k for k, v in res["parts"].items() if v["status"] == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
