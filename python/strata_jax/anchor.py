"""Monolithic performance anchors for bench/ (docs/performance.md).

The same train step as reference_train.py, as one jax.jit, in two shapes
MaxText users choose between:

- ``unroll``: the Python loop over blocks is traced N times, so XLA sees
  every layer (reference_train.make_train_step itself; compile time grows
  with depth);
- ``scan``: block parameters stacked along a leading layer axis and the
  blocks run by ``lax.scan`` (compile time roughly flat in depth, like
  strata's one-program-per-structure bundle).

Both do the arithmetic of docs/model.md (microbatches under ``lax.scan``,
per-group-instance squared norms, clip, ``optim.adamw_update``), so their
losses match the reference to float rounding (tests/py/test_anchor.py).

    python -m strata_jax.anchor CONFIG [k=v ...] --variant unroll|scan --out FILE.json
        [--steps N] [--compile-only] [--config-json FILE --tokens TOKFILE]
        [--mesh data=D,fsdp=F,tensor=T]

With ``--mesh`` the step is one jit over D x F x T devices with in/out
shardings, MaxText's way (shardings.py; docs/parallelism.md).

Writes one JSON object: trace/lower/compile seconds, per-step seconds,
XLA's memory analysis of the compiled step and the process's peak RSS.
Nothing is cached across processes (JAX's persistent compilation cache is
switched off), so every run is a cold compile.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax._src import xla_bridge as xb  # plugin registration has no public API in 0.11

from . import model as M
from . import registry as R
from .config import ModelConfig, TrainConfig
from .data import DataError, Source
from .mesh import ParallelError, make_mesh, mesh_for_cli
from .optim import adamw_update, lr_at, sqnorm
from .reference_train import (InputError, add_input_args, batch_tuple, host_loss, init_opt_state, load_inputs,
                              make_sampler, make_train_step, model_config, norm_and_gscale)
from .shardings import mesh_shardings, step_shardings  # noqa: F401  (anchor.<name>, as before shardings.py)

Array = jax.Array
VARIANTS = ("unroll", "scan")
# Diagnostic only: unrolled, each block under jax.checkpoint, so its forward
# runs again inside the backward pass as strata's block_bwd program does.
DIAG_VARIANTS = ("unroll_remat",)


# --- the scan-over-layers step -----------------------------------------------

def _scan_kind(cfg: ModelConfig) -> Any:
    """The one block kind of a stack the scan variant can stack."""
    kinds = set(cfg.layer_kinds())
    if len(kinds) != 1:
        raise ValueError(f"the scan variant needs one block kind for every layer; model.layers has {sorted(kinds)} "
                         "(use the unroll variant)")
    return R.KINDS[kinds.pop()]


def stack_blocks(params: M.FullParams, cfg: ModelConfig | None = None) -> dict[str, Any]:
    """{"embed", "blocks": [dict] * N, "head"} -> blocks as {name: [N, ...]}."""
    names = _scan_kind(cfg).params(cfg) if cfg is not None else M.BLOCK_PARAMS
    blocks = {k: jnp.stack([b[k] for b in params["blocks"]]) for k in names}
    return {"embed": params["embed"], "blocks": blocks, "head": params["head"]}


def unstack_blocks(params: dict[str, Any], n_layers: int) -> M.FullParams:
    blocks = [{k: params["blocks"][k][i] for k in params["blocks"]} for i in range(n_layers)]
    return {"embed": params["embed"], "blocks": blocks, "head": params["head"]}


def scan_model_loss(cfg: ModelConfig, params: dict[str, Any], tokens: Array, targets: Array,
                    mask: Array, positions: Array | None = None) -> Array:
    """model.model_loss with the blocks under lax.scan (|positions|: as model_loss)."""
    pos = positions if cfg.packed else None
    wte = params["embed"]["wte"]
    with M.packed(pos):
        x = M.embed(cfg, params["embed"], tokens, positions=pos)
        fwd = _scan_kind(cfg).fwd
        x, _ = jax.lax.scan(lambda h, p: (fwd(cfg, p, h), None), x, params["blocks"])
    return M.head_loss(cfg, params["head"], wte if cfg.tie_embeddings else None, x, targets, mask)


def remat_model_loss(cfg: ModelConfig, params: M.FullParams, tokens: Array, targets: Array,
                     mask: Array, positions: Array | None = None) -> Array:
    """model.model_loss with each block under jax.checkpoint."""
    pos = positions if cfg.packed else None
    wte = params["embed"]["wte"]
    with M.packed(pos):
        x = M.embed(cfg, params["embed"], tokens, positions=pos)
        for kind, p in zip(cfg.layer_kinds(), params["blocks"], strict=True):
            x = jax.checkpoint(lambda p_, h, f=R.KINDS[kind].fwd: f(cfg, p_, h))(p, x)
    return M.head_loss(cfg, params["head"], wte if cfg.tie_embeddings else None, x, targets, mask)


def make_scan_train_step(cfg: ModelConfig, shardings: tuple[Any, Any] | None = None) -> Callable[..., Any]:
    """Like reference_train.make_train_step, on stacked block parameters:
    jit(params, m, v, tokens, targets, mask, step, lr, hyper, grad_clip) ->
    (params, m, v, micro_losses, group_sqnorms[embed, layers..., head]);
    under packing none or pack positions after mask and the global
    normalisation, as make_train_step."""
    loss_and_grad = jax.value_and_grad(lambda p, *xs: scan_model_loss(cfg, p, *xs))
    emb_names = M.group_param_names(cfg, "embed")
    head_names = M.group_param_names(cfg, "head")

    def step_core(params: Any, m: Any, v: Any, batch: tuple[Array, ...],
                  step: Array, lr: Array, hyper: Array, grad_clip: Array) -> Any:
        n_micro = batch[0].shape[0]

        def micro(gsum: Any, xs: tuple[Array, ...]) -> tuple[Any, Array]:
            loss, g = loss_and_grad(params, *xs)
            return jax.tree.map(jnp.add, gsum, g), loss

        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, losses = jax.lax.scan(micro, zeros, batch)
        g_emb, g_blk, g_head = grads["embed"], grads["blocks"], grads["head"]
        # Per-layer norms of the stacked gradients, in the reference's group order.
        blk_names = _scan_kind(cfg).params(cfg)
        blk_sq = jax.vmap(lambda *gs: sqnorm(list(gs)))(*[g_blk[k] for k in blk_names])
        sqn = jnp.concatenate([sqnorm([g_emb[k] for k in emb_names])[None], blk_sq,
                               sqnorm([g_head[k] for k in head_names])[None]])
        total = jnp.float32(0.0)
        for i in range(sqn.shape[0]):
            total = total + sqn[i]
        norm, gscale = norm_and_gscale(cfg, total, batch[2], n_micro, grad_clip)

        out: dict[str, tuple[dict[str, Array], ...]] = {}
        for group, names, lead in (("embed", emb_names, 0), ("blocks", blk_names, 1),
                                   ("head", head_names, 0)):
            p, g, mi, vi = params[group], grads[group], m[group], v[group]
            # AdamW is elementwise, so it applies to stacked layers as they
            # are; weight decay follows the per-layer rank.
            res = adamw_update([p[k] for k in names], [g[k] for k in names], [mi[k] for k in names],
                               [vi[k] for k in names], [p[k].ndim - lead >= 2 for k in names],
                               step, lr, gscale, hyper)
            out[group] = tuple(dict(zip(names, a)) for a in res)

        def regroup(j: int) -> Any:
            return {g: out[g][j] for g in ("embed", "blocks", "head")}

        return regroup(0), regroup(1), regroup(2), losses, sqn

    if cfg.weighted_loss:
        def step_fn(params: Any, m: Any, v: Any, tokens: Array, targets: Array, mask: Array, positions: Array,
                    step: Array, lr: Array, hyper: Array, grad_clip: Array) -> Any:
            return step_core(params, m, v, (tokens, targets, mask, positions), step, lr, hyper, grad_clip)
    else:
        def step_fn(params: Any, m: Any, v: Any, tokens: Array, targets: Array, mask: Array,  # type: ignore[misc]
                    step: Array, lr: Array, hyper: Array, grad_clip: Array) -> Any:
            return step_core(params, m, v, (tokens, targets, mask), step, lr, hyper, grad_clip)

    if shardings is not None:
        return jax.jit(step_fn, donate_argnums=(0, 1, 2), in_shardings=shardings[0], out_shardings=shardings[1])
    return jax.jit(step_fn, donate_argnums=(0, 1, 2))


# --- measurement --------------------------------------------------------------

def _peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _memory_analysis(compiled: Any) -> dict[str, int] | None:
    try:
        ma = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if ma is None:
        return None
    keys = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "generated_code_size_in_bytes")
    out = {k: int(getattr(ma, k)) for k in keys if hasattr(ma, k)}
    # Live device bytes at the peak of one step: inputs, plus outputs that do
    # not reuse a donated input, plus XLA's temporaries.
    out["peak_bytes_estimate"] = (out.get("argument_size_in_bytes", 0) + out.get("output_size_in_bytes", 0)
                                  - out.get("alias_size_in_bytes", 0) + out.get("temp_size_in_bytes", 0))
    return out


def plugin_device(path: str, cpu_devices: int = 0) -> Any:
    """Loads a PJRT plugin into JAX as its own backend and returns its device 0.

    With strata's CPU plugin this runs the anchor on the very client strata
    uses (same XLA build, same thread pool sizing) instead of jaxlib's
    built-in CPU client. Must be called before JAX initialises its backends.
    cpu_devices > 0 passes cpu_device_count (CPU plugins only), as strata's
    runtime.cpu_devices does."""
    opts = {"cpu_device_count": cpu_devices} if cpu_devices > 0 else None
    xb.register_plugin("strata_plugin", library_path=path, priority=-1, options=opts)
    platforms = jax.config.jax_platforms
    if platforms and "strata_plugin" not in platforms.split(","):
        jax.config.update("jax_platforms", f"{platforms},strata_plugin")
    return jax.devices("strata_plugin")[0]


def run(config: dict[str, Any], tokens: np.ndarray | list[Source], variant: str, steps: int | None = None,
        compile_only: bool = False, device: Any = None, mesh: Any = None) -> dict[str, Any]:
    """Compiles the chosen step (timed: trace+lower, then XLA compile) and,
    unless compile_only, trains `steps` steps timing each one from the host
    batch to the losses on the host (what strata's step_time_s covers).
    `device`: where everything runs (default: JAX's default device).
    `mesh` (mesh.MeshSpec): one jit over that many devices (of `device`'s
    client, else JAX's default backend), sharded as mesh_shardings says."""
    jmesh = None
    if mesh is not None and mesh.devices > 1:
        jmesh = make_mesh(mesh, device.client.devices() if device is not None else None)
    if device is None:
        r = _run(config, tokens, variant, steps, compile_only, jmesh)
    else:
        with jax.default_device(device):
            r = _run(config, tokens, variant, steps, compile_only, jmesh)
        want = sorted(str(d) for d in jmesh.devices.flat) if jmesh is not None else [str(device)]
        if r["param_devices"] != want or r["param_clients"] != [id(device.client)]:
            raise RuntimeError(f"anchor: parameters ended up on {r['param_devices']}, not on {want}")
        r["devices"] = want
        r["client"] = f"plugin {device.client.platform} {device.client.platform_version}"
    r["mesh"] = mesh.to_json() if mesh is not None else {"data": 1, "fsdp": 1, "tensor": 1}
    del r["param_clients"]  # object ids: only meaningful inside this process
    return r


def _run(config: dict[str, Any], tokens: np.ndarray | list[Source], variant: str, steps: int | None,
         compile_only: bool, jmesh: Any = None) -> dict[str, Any]:
    if variant not in VARIANTS + DIAG_VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS + DIAG_VARIANTS}, got {variant!r}")
    cfg = model_config(config)
    if cfg.optimizer is not None and (variant == "scan" or jmesh is not None):
        # The scan variant's stacked layers would need each optimizer's
        # update over a layer axis; the mesh its state's shardings.
        raise ValueError(f"anchor: train.optimizer other than AdamW everywhere runs only unrolled on one device "
                         f"(variant {variant!r}{', --mesh' if jmesh is not None else ''})")
    tc = TrainConfig.from_dict({**config["train"], **({"steps": steps} if steps is not None else {})})
    seed = int(config["seed"])
    sampler = make_sampler(config, tokens, cfg, tc)
    t0 = time.perf_counter()
    params = M.init_params(cfg, seed)
    if variant == "scan":
        params = stack_blocks(params, cfg)
    shardings = batch_sharding = None
    if jmesh is not None:
        shardings = step_shardings(params, jmesh, n_batch=len(batch_tuple(cfg, sampler.batch(0))))
        params = jax.device_put(params, shardings[0][0])
        batch_sharding = shardings[0][3]
    jax.block_until_ready(params)
    init_s = time.perf_counter() - t0
    # Where the step really runs (a plugin device prints like jaxlib's own).
    leaf_devices = {d for leaf in jax.tree.leaves(params) for d in leaf.devices()}
    m, v = init_opt_state(cfg, params)
    if variant == "scan":
        step_fn = make_scan_train_step(cfg, shardings)
    elif variant == "unroll_remat":
        step_fn = make_train_step(cfg, remat_model_loss, shardings)
    else:
        step_fn = make_train_step(cfg, shardings=shardings)
    hyper, clip = jnp.asarray(tc.hyper), jnp.float32(tc.grad_clip)

    def batch(k: int) -> tuple[Array, ...]:
        b = batch_tuple(cfg, sampler.batch(k))
        if batch_sharding is not None:  # straight from the host to each device's part
            return tuple(jax.device_put(a, batch_sharding) for a in b)
        return tuple(jnp.asarray(a) for a in b)

    t0 = time.perf_counter()
    lowered = step_fn.lower(params, m, v, *batch(0), jnp.float32(1), jnp.float32(0), hyper, clip)
    lower_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    result: dict[str, Any] = {
        "variant": variant, "n_layers": cfg.n_layers, "compute_dtype": cfg.compute_dtype,
        "jax_version": jax.__version__, "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()], "client": f"jaxlib {jax.default_backend()}",
        "host": platform.node(),
        "init_s": init_s, "lower_s": lower_s, "compile_s": compile_s,
        "param_devices": sorted({str(d) for d in leaf_devices}),
        "param_clients": sorted({id(d.client) for d in leaf_devices}),
        "memory": _memory_analysis(compiled), "steps": 0, "step_time_s": [], "losses": [],
        "step_start_unix": [], "step_cpu_s": [], "step_minor_faults": [],
    }
    if not compile_only:
        for k in range(tc.steps):
            t = k + 1
            lr = lr_at(t, lr=tc.lr, min_lr_ratio=tc.min_lr_ratio, warmup_steps=tc.warmup_steps,
                       steps=tc.steps)
            mask_k = sampler.batch(k).mask if cfg.weighted_loss else None  # for the loss's W, outside the timing
            result["step_start_unix"].append(time.time())
            c0, f0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            params, m, v, losses, sqn = compiled(params, m, v, *batch(k), jnp.float32(t),
                                                 jnp.float32(lr), hyper, clip)
            loss = (host_loss(cfg, np.asarray(losses), mask_k) if mask_k is not None
                    else float(np.mean(np.asarray(losses, np.float64))))
            np.asarray(sqn)
            result["step_time_s"].append(time.perf_counter() - t0)
            # CPU time of all threads and minor page faults: less sensitive
            # than wall time to other processes on a shared machine.
            result["step_cpu_s"].append(time.process_time() - c0)
            result["step_minor_faults"].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            result["losses"].append(loss)
        result["steps"] = tc.steps
    if jmesh is not None:
        # How the first block's parameters lie after the last step (the jit's
        # out_shardings), as PartitionSpecs.
        blk = params["blocks"] if isinstance(params["blocks"], dict) else params["blocks"][0]
        result["param_specs"] = {k: str(getattr(a.sharding, "spec", None)) for k, a in blk.items()}
        result["param_specs"]["wte"] = str(getattr(params["embed"]["wte"].sharding, "spec", None))
    result["peak_rss_bytes"] = _peak_rss_bytes()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata_jax.anchor",
                                 description="monolithic jax.jit anchor (unrolled or scanned layers) for bench/")
    add_input_args(ap)
    ap.add_argument("--variant", choices=VARIANTS + DIAG_VARIANTS, required=True)
    ap.add_argument("--steps", type=int, default=None, help="override train.steps")
    ap.add_argument("--compile-only", action="store_true", help="stop after compiling the step")
    ap.add_argument("--plugin", help="run on this PJRT plugin (e.g. strata's CPU plugin) instead of jaxlib's client")
    ap.add_argument("--cpu-devices", type=int, default=0, help="with --plugin: cpu_device_count (CPU plugins)")
    ap.add_argument("--mesh", default=None,
                    help="one jit over a device mesh, e.g. data=2,tensor=2 (batch over data x fsdp, parameters and "
                         "optimizer state over fsdp, heads/MLP hidden/vocab over tensor); without --plugin, JAX's "
                         "CPU device count is set to the mesh's")
    ap.add_argument("--out", required=True, help="JSON result file")
    args = ap.parse_args(argv)
    mesh = None
    if args.mesh:
        try:
            mesh = mesh_for_cli(args.mesh, set_cpu_devices=not args.plugin)
        except ParallelError as e:
            print(f"anchor: {e}", file=sys.stderr)
            return 2
    # A warm persistent cache would turn the compile time into a lookup time.
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        config, tokens = load_inputs(ap, args)
    except InputError as e:
        print(f"anchor: {e}", file=sys.stderr)
        return e.code
    try:
        device = plugin_device(args.plugin, args.cpu_devices) if args.plugin else None
        result = run(config, tokens, args.variant, args.steps, args.compile_only, device, mesh)
    except (OSError, ValueError, KeyError) as e:
        print(f"anchor: bad config: {e}", file=sys.stderr)
        return 2
    except DataError as e:
        print(f"anchor: data error: {e}", file=sys.stderr)
        return 3
    tmp = f"{args.out}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
