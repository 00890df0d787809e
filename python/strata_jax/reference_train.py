"""Monolithic reference trainer: the same model, init, data, schedule, clipping
and AdamW as the C trainer, as one jitted train step (MaxText style).

It exists for equivalence tests and benchmarks only (docs/model.md).

    python -m strata_jax.reference_train CONFIG [k=v ...] --out DIR [--steps N]
    python -m strata_jax.reference_train --config-json FILE --tokens TOKFILE --out DIR [--steps N]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import model as M
from . import optimizers as O
from . import registry as R
from .config import ModelConfig, OptimizerSpec, TrainConfig
from .data import Batch, DataError, Sampler, Source, read_token_file, read_token_file_prompts
from .mesh import ParallelError, make_mesh, mesh_for_cli
from .model import FullParams
from .optim import adamw_update, clip_scale, lr_at, sqnorm
from .shardings import step_shardings

Array = jax.Array


def load_config(path_or_json: str) -> dict[str, Any]:
    s = path_or_json.strip()
    if not s.startswith("{"):
        with open(path_or_json, encoding="utf-8") as f:
            s = f.read()
    cfg = json.loads(s)
    model = dict(cfg["model"])
    train = cfg["train"]
    if int(train["batch_size"]) % int(train["microbatches"]):
        raise ValueError("train.batch_size must be a multiple of train.microbatches")
    mb = int(train["batch_size"]) // int(train["microbatches"])
    if "microbatch_size" in model and int(model["microbatch_size"]) != mb:
        raise ValueError(f"model.microbatch_size {model['microbatch_size']} != batch_size/microbatches {mb}")
    model["microbatch_size"] = mb
    # data.packing is the model's too (docs/model.md, "Packing"): strata puts
    # it in the model JSON it exports from; a resolved config has it in data.
    packing = (cfg.get("data") or {}).get("packing")
    if packing is not None and "packing" not in model:
        model["packing"] = packing
    cfg["model"] = model
    return cfg


def optimizer_spec(config: dict[str, Any]) -> OptimizerSpec | None:
    """The optimizer object of a resolved config: the model section's
    "optimizer" (the model JSON's), else train.optimizer, momentum, nesterov
    and optimizer_groups; None for AdamW everywhere (docs/model.md, "Optimizers")."""
    model = config.get("model") or {}
    if model.get("optimizer") is not None:
        return OptimizerSpec.from_json(model["optimizer"])
    train = config.get("train") or {}
    groups = train.get("optimizer_groups") or []
    if isinstance(groups, str):
        groups = [g.strip() for g in groups.split(",") if g.strip()]
    default = str(train.get("optimizer", "adamw") or "adamw")
    if default == "adamw" and not groups:
        return None
    return OptimizerSpec(default, float(train.get("momentum", 0.9)), bool(train.get("nesterov", False)),
                         tuple(str(g) for g in groups))


def model_config(config: dict[str, Any]) -> ModelConfig:
    """The ModelConfig of a resolved config, its optimizer object included."""
    model = dict(config["model"])
    spec = optimizer_spec(config)
    if spec is not None:
        model["optimizer"] = spec.to_json()
    return ModelConfig.from_dict(model)


def init_opt_state(cfg: ModelConfig, params: FullParams) -> tuple[Any, Any]:
    """The step's (m, v) at step 0: AdamW's zero moments like |params|
    (cfg.optimizer None), or under an optimizer object the state tensors of
    each group instance in program order (optimizers.state_layout) as m and
    empty lists as v."""
    if cfg.optimizer is None:
        return jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params)
    assign, c = O.assignment(cfg), O.constants(cfg.optimizer)

    def zeros(group: str) -> list[Array]:
        shapes = [M.param_shape(cfg, n, group) for n in M.group_param_names(cfg, group)]
        return [jnp.zeros(s.shape, jnp.float32) for s in O.state_layout(shapes, assign[group], c)]

    kinds = [R.KINDS[k].group_name for k in cfg.layer_kinds()]
    m = {"embed": zeros("embed"), "blocks": [zeros(g) for g in kinds], "head": zeros("head")}
    return m, {"embed": [], "blocks": [[] for _ in kinds], "head": []}


def norm_and_gscale(cfg: ModelConfig, total: Array, mask: Array, n_micro: int, grad_clip: Array) -> tuple[Array, Array]:
    """The global gradient norm and the optimizer's gradient scale (clip
    included) from the summed squared norms |total|: over the microbatch
    means (concat), or normalised by the batch's weights |mask| (packing
    none/pack, docs/data.md "Loss normalisation"), as the C trainer."""
    if cfg.weighted_loss:
        scale = weight_scale(cfg, mask)
        norm = jnp.sqrt(total) * scale
        clip = jnp.where(grad_clip > 0, jnp.minimum(1.0, grad_clip / (norm + 1e-6)), 1.0)
        return norm, clip * scale
    norm = jnp.sqrt(total) / n_micro
    clip = jnp.where(grad_clip > 0, jnp.minimum(1.0, grad_clip / (norm + 1e-6)), 1.0)
    return norm, clip / n_micro


def make_train_step(cfg: ModelConfig, loss_fn: Callable[..., Array] = M.model_loss,
                    shardings: tuple[Any, Any] | None = None, with_metrics: bool = False) -> Callable[..., Any]:
    """jit(params, m, v, tokens, targets, mask, step, lr, hyper, grad_clip) ->
    (params, m, v, micro_losses[n_micro], group_sqnorms[n_groups]), and with
    |with_metrics| the block metrics too ({name: [per layer: [n_micro, ...]]}).
    The gradient is model.model_objective's (the head's loss plus the layers'
    auxiliary losses); the losses reported are the head's.
    Under packing none or pack the step takes positions ([n_micro, mb, T]
    s32) after mask, and the summed gradients are scaled by (mb * T) / W,
    W the sum of the whole batch's mask, instead of 1 / n_micro
    (docs/model.md, "Packing": the loss is sum(ce * w) / sum(w) over the
    global batch); the micro_losses are the head's sum(ce * mask) / (mb * T).
    loss_fn(cfg, params, tokens, targets, mask[, positions]) is only replaced
    by the benchmark anchors (anchor.py), with the same math; so are |shardings|
    ((in_shardings, out_shardings) of the jit, for a device mesh).
    With cfg.optimizer (docs/model.md, "Optimizers") m is the tree of each
    group instance's state tensors and v empty lists (init_opt_state), and
    each group is updated by optimizers.group_update, as update_<group>."""
    if loss_fn is M.model_loss:
        objective = lambda p, *xs: M.model_objective(cfg, p, *xs)  # noqa: E731
    else:
        def objective(p: Any, *xs: Array) -> tuple[Array, Any]:
            value = loss_fn(cfg, p, *xs)
            return value, (value, {})
    loss_and_grad = jax.value_and_grad(objective, has_aux=True)
    gnames = ["embed"] + [R.KINDS[k].group_name for k in cfg.layer_kinds()] + ["head"]
    if cfg.optimizer is not None:
        assign, consts = O.assignment(cfg), O.constants(cfg.optimizer)
        layouts = {g: O.state_layout([M.param_shape(cfg, n, g) for n in M.group_param_names(cfg, g)], assign[g],
                                     consts) for g in set(gnames)}

    def step_core(params: FullParams, m: FullParams, v: FullParams, batch: tuple[Array, ...],
                  step: Array, lr: Array, hyper: Array, grad_clip: Array) -> Any:
        n_micro = batch[0].shape[0]

        def micro(gsum: FullParams, xs: tuple[Array, ...]) -> tuple[FullParams, Any]:
            (_, (loss, mets)), g = loss_and_grad(params, *xs)
            return jax.tree.map(jnp.add, gsum, g), (loss, mets)

        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, (losses, metrics) = jax.lax.scan(micro, zeros, batch)

        groups = [(params["embed"], grads["embed"], m["embed"], v["embed"])]
        groups += [(params["blocks"][i], grads["blocks"][i], m["blocks"][i], v["blocks"][i])
                   for i in range(cfg.n_layers)]
        groups.append((params["head"], grads["head"], m["head"], v["head"]))
        order = [M.group_param_names(cfg, "embed")] + [R.KINDS[k].params(cfg) for k in cfg.layer_kinds()]
        order.append(M.group_param_names(cfg, "head"))
        sqn = jnp.stack([sqnorm([g[k] for k in names]) for (_, g, _, _), names in zip(groups, order)])
        total = jnp.float32(0.0)
        for i in range(sqn.shape[0]):  # in group order, like the C trainer (which sums in f64)
            total = total + sqn[i]
        norm, gscale = norm_and_gscale(cfg, total, batch[2], n_micro, grad_clip)

        new = []
        for (p, g, mi, vi), names, gname in zip(groups, order, gnames):
            if cfg.optimizer is not None:  # the registry's update, as update_<group>
                np_, ns = O.group_update(assign[gname], layouts[gname], [p[k] for k in names], [g[k] for k in names],
                                         mi, [p[k].ndim >= 2 for k in names], step, lr, gscale, hyper, consts)
                new.append((dict(zip(names, np_)), ns, vi))
                continue
            np_, nm, nv = adamw_update([p[k] for k in names], [g[k] for k in names],
                                       [mi[k] for k in names], [vi[k] for k in names],
                                       [p[k].ndim >= 2 for k in names], step, lr, gscale, hyper)
            new.append(tuple(dict(zip(names, a)) for a in (np_, nm, nv)))

        def regroup(j: int) -> FullParams:
            return {"embed": new[0][j], "blocks": [n[j] for n in new[1:-1]], "head": new[-1][j]}

        if with_metrics:
            return regroup(0), regroup(1), regroup(2), losses, sqn, metrics
        return regroup(0), regroup(1), regroup(2), losses, sqn

    if cfg.weighted_loss:
        def step_fn(params: FullParams, m: FullParams, v: FullParams, tokens: Array, targets: Array,
                    mask: Array, positions: Array, step: Array, lr: Array, hyper: Array, grad_clip: Array) -> Any:
            return step_core(params, m, v, (tokens, targets, mask, positions), step, lr, hyper, grad_clip)
    else:
        def step_fn(params: FullParams, m: FullParams, v: FullParams, tokens: Array, targets: Array,  # type: ignore[misc]
                    mask: Array, step: Array, lr: Array, hyper: Array, grad_clip: Array) -> Any:
            return step_core(params, m, v, (tokens, targets, mask), step, lr, hyper, grad_clip)

    if shardings is not None:
        return jax.jit(step_fn, donate_argnums=(0, 1, 2), in_shardings=shardings[0], out_shardings=shardings[1])
    return jax.jit(step_fn, donate_argnums=(0, 1, 2))


def weight_scale(cfg: ModelConfig, mask: Array) -> Array:
    """(mb * T) / W, f32, W = the sum of |mask| (the whole batch's weights,
    every microbatch and data shard): what the summed gradients and the sum of
    the microbatch losses are multiplied by under packing none or pack. A
    batch without weight (W = 0) trains nothing: 0."""
    w = jnp.sum(mask.astype(jnp.float32))
    return jnp.where(w > 0, jnp.float32(cfg.microbatch_size * cfg.seq_len) / jnp.maximum(w, 1.0), jnp.float32(0.0))


def host_loss(cfg: ModelConfig, micro_losses: np.ndarray, mask: np.ndarray) -> float:
    """The step's (or the eval set's) loss from the per-microbatch losses, in
    float64 on the host as the C trainer does: their mean under concat, else
    their sum times (mb * T) / W, i.e. sum(ce * w) / sum(w) over the batch."""
    losses = np.asarray(micro_losses, np.float64)
    if not cfg.weighted_loss:
        return float(np.sum(losses) / len(losses))
    w = float(np.sum(np.asarray(mask, np.float64)))
    return float(np.sum(losses) * (cfg.microbatch_size * cfg.seq_len) / w) if w > 0 else 0.0


def make_eval(cfg: ModelConfig) -> Callable[..., Array]:
    """jit(params, tokens, targets, mask[, positions]) -> per-microbatch losses
    (positions under packing none or pack, as make_train_step)."""
    def fn(params: FullParams, *batch: Array) -> Array:
        return jax.lax.map(lambda xs: M.model_loss(cfg, params, *xs), batch)
    return jax.jit(fn)


def batch_positions(b: Batch) -> np.ndarray:
    """The batch's positions ([n_micro, mb, T] int32); 0..T-1 in every
    sequence for a batch that has none (concat windows)."""
    pos = getattr(b, "positions", None)
    if pos is not None:
        return np.asarray(pos, np.int32)
    return np.broadcast_to(np.arange(b.tokens.shape[-1], dtype=np.int32), b.tokens.shape).copy()


def batch_tuple(cfg: ModelConfig, b: Batch) -> tuple[np.ndarray, ...]:
    """What the step and the eval take of a batch: tokens, targets, mask, and
    under packing none or pack its positions."""
    out = (b.tokens, b.targets, b.mask)
    return out + (batch_positions(b),) if cfg.weighted_loss else out


def make_sampler(config: dict[str, Any], tokens: np.ndarray | list[Source], cfg: ModelConfig,
                 tc: TrainConfig) -> Sampler:
    """docs/data.md's batches of |config|: windows of |tokens| (packing
    concat), or the document stream over the |tokens| sources (none, pack)."""
    packing = str(config["data"].get("packing", "concat"))
    common = dict(seed=int(config["seed"]), val_fraction=float(config["data"]["val_fraction"]), seq_len=cfg.seq_len,
                  batch_size=tc.batch_size, microbatches=tc.microbatches, packing=packing)
    if isinstance(tokens, list):
        return Sampler(None, sources=tokens, **common)
    return Sampler(tokens, **common)


def read_sources(config: dict[str, Any], paths: list[str]) -> list[Source]:
    """The version-3 token files |paths| (one per source, in data.sources
    order, as `strata data` lists them) with data.weights' weights."""
    weights = [float(w) for w in config["data"].get("weights") or []] or [1.0] * len(paths)
    if len(weights) != len(paths):
        raise DataError(f"{len(paths)} token files for {len(weights)} data.weights")
    out = []
    for path, w in zip(paths, weights, strict=True):
        tok, _, starts, prompts = read_token_file_prompts(path)
        if starts is None:
            raise DataError(f"{path}: packing none/pack needs a version-3 token file (document starts)")
        out.append(Source(tok, starts, w, prompts))
    return out


def train(config: dict[str, Any], tokens: np.ndarray | list[Source], steps: int | None = None,
          log: Callable[[str], None] | None = None, mesh: Any = None) -> tuple[FullParams, dict[str, Any]]:
    """Runs the reference; returns (final params, history as written to losses.json).
    |mesh| (mesh.MeshSpec): the step as one jit over that many of JAX's
    devices, sharded as the anchor's (shardings.mesh_shardings)."""
    cfg = model_config(config)
    tc = TrainConfig.from_dict(config["train"])
    if cfg.optimizer is not None and mesh is not None and mesh.devices > 1:
        raise ValueError("reference_train: --mesh with an optimizer other than AdamW everywhere is not built")
    if steps is not None:
        tc = TrainConfig.from_dict({**config["train"], "steps": steps})
    seed = int(config["seed"])
    sampler = make_sampler(config, tokens, cfg, tc)

    params = M.init_params(cfg, seed)
    shardings = None

    def batch_arrays(b: Batch) -> tuple[Array, ...]:
        return tuple(jnp.asarray(a) for a in batch_tuple(cfg, b))
    if mesh is not None and mesh.devices > 1:
        shardings = step_shardings(params, make_mesh(mesh), n_batch=len(batch_tuple(cfg, sampler.batch(0))))
        params = jax.device_put(params, shardings[0][0])
        bs = shardings[0][3]

        def batch_arrays(b: Batch) -> tuple[Array, ...]:
            return tuple(jax.device_put(a, bs) for a in batch_tuple(cfg, b))
    m, v = init_opt_state(cfg, params)
    with_metrics = any(R.KINDS[k].metrics for k in cfg.layer_kinds())
    step_fn, eval_fn = make_train_step(cfg, shardings=shardings, with_metrics=with_metrics), make_eval(cfg)
    hyper, clip = jnp.asarray(tc.hyper), jnp.float32(tc.grad_clip)
    eval_batch = sampler.eval_batch(tc.eval_batches) if tc.eval_batches > 0 else None
    eval_data = batch_arrays(eval_batch) if eval_batch is not None else None

    hist: dict[str, Any] = {"losses": [], "grad_norms": [], "lrs": [], "step_time_s": [], "eval_losses": []}
    for k in range(tc.steps):
        t = k + 1
        lr = lr_at(t, lr=tc.lr, min_lr_ratio=tc.min_lr_ratio, warmup_steps=tc.warmup_steps, steps=tc.steps)
        t0 = time.perf_counter()
        b = sampler.batch(k)
        out = step_fn(params, m, v, *batch_arrays(b), jnp.float32(t), jnp.float32(lr), hyper, clip)
        params, m, v, losses, sqn = out[:5]
        if with_metrics:
            _record_metrics(hist, out[5])
        sqn_h = np.asarray(sqn, np.float64)
        hist["step_time_s"].append(time.perf_counter() - t0)
        loss = host_loss(cfg, np.asarray(losses), b.mask)
        norm = host_norm(cfg, tc, float(sum(sqn_h)), b.mask)
        hist["losses"].append(loss)
        hist["grad_norms"].append(norm)
        hist["lrs"].append(lr)
        line = f"step {t} loss {loss:.6f} grad_norm {norm:.4f} lr {lr:.3e} clip {clip_scale(norm, tc.grad_clip):.3f}"
        if eval_data is not None and ((tc.eval_every > 0 and t % tc.eval_every == 0) or t == tc.steps):
            assert eval_batch is not None
            hist["eval_losses"].append([t, host_loss(cfg, np.asarray(eval_fn(params, *eval_data)), eval_batch.mask)])
            line += f" eval {hist['eval_losses'][-1][1]:.6f}"
        if log:
            log(line)
    return params, hist


def host_norm(cfg: ModelConfig, tc: TrainConfig, sqnorm_sum: float, mask: np.ndarray) -> float:
    """The reported grad_norm from the summed gradients' squared norm (float64,
    the host's): divided by the microbatches under concat, else times
    (mb * T) / W (weight_scale)."""
    if not cfg.weighted_loss:
        return math.sqrt(sqnorm_sum) / tc.microbatches
    w = float(np.sum(np.asarray(mask, np.float64)))
    return math.sqrt(sqnorm_sum) * (cfg.microbatch_size * cfg.seq_len / w) if w > 0 else 0.0


def _record_metrics(hist: dict[str, Any], metrics: dict[str, list[Array]]) -> None:
    """The block metrics of a step as the C trainer reports them
    (docs/bundle.md, "Block metrics"): a scalar's mean over layers and microbatches
    (f64 on the host), a vector's least and largest element."""
    for name, per_layer in metrics.items():
        vals = [np.asarray(a, np.float64) for a in per_layer]
        if vals[0].ndim == 1:  # [n_micro]: a scalar per microbatch
            hist.setdefault(name, []).append(float(np.mean(np.concatenate(vals))))
        else:
            hist.setdefault(name + "_min", []).append(float(min(np.min(a) for a in vals)))
            hist.setdefault(name + "_max", []).append(float(max(np.max(a) for a in vals)))


def save_params(params: FullParams, path: str) -> None:
    from safetensors.numpy import save_file  # optional (strata_jax[reference]): only writing parameters needs it
    save_file({k: np.asarray(a) for k, a in M.flatten_params(params).items()}, path)


def _strata(args: list[str]) -> str:
    """Runs the strata binary ($STRATA_BIN, else build/strata of this checkout)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    exe = os.environ.get("STRATA_BIN", os.path.join(root, "build", "strata"))
    r = subprocess.run([exe, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{exe} {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


class InputError(Exception):
    """Bad inputs of a monolithic run; |code| is the exit code (2 config, 3 data)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def add_input_args(ap: argparse.ArgumentParser) -> None:
    """CONFIG [k=v ...], or --config-json and --tokens: the inputs of every
    monolithic JAX run (this reference and the bench anchors)."""
    ap.add_argument("config", nargs="?", help="strata config file (resolved with `strata config --json`)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, as for `strata train`")
    ap.add_argument("--config-json", help="resolved config (JSON file or string) instead of CONFIG")
    ap.add_argument("--tokens", action="append",
                    help="token file (.tok, docs/data.md); with data.packing none/pack one per source, in "
                         "data.sources order (repeat the flag); default: `strata data CONFIG`")


def token_files(data_output: str) -> list[str]:
    """The token files `strata data` names: one per source (its "source ...
    token_file PATH" lines, packing none/pack), else its first line."""
    srcs = [line.rsplit(" token_file ", 1)[1] for line in data_output.splitlines()
            if line.startswith("source ") and " token_file " in line]
    return srcs or data_output.splitlines()[:1]


def load_inputs(ap: argparse.ArgumentParser,
                args: argparse.Namespace) -> tuple[dict[str, Any], np.ndarray | list[Source]]:
    """(resolved config, tokens) from the arguments of add_input_args; the
    tokens are the sources (Source) under data.packing none/pack.
    Raises InputError; a missing input is a usage error (ap.error)."""
    if args.config:
        # The C side is the one source of truth for config resolution and
        # tokenization: ask the strata binary rather than re-implementing them.
        try:
            args.config_json = args.config_json or _strata(["config", "--json", args.config, *args.overrides])
            args.tokens = args.tokens or token_files(_strata(["data", args.config, *args.overrides]))
        except RuntimeError as e:
            raise InputError(2, str(e)) from e
    if not args.config_json or not args.tokens:
        ap.error("give CONFIG [k=v ...], or both --config-json and --tokens")
    try:
        config = load_config(args.config_json)
        if str(config["data"].get("packing", "concat")) != "concat":
            return config, read_sources(config, args.tokens)
        if len(args.tokens) != 1:
            raise InputError(2, f"data.packing=concat reads one token file, {len(args.tokens)} given")
        tokens, vocab = read_token_file(args.tokens[0])
    except (OSError, ValueError, KeyError) as e:
        raise InputError(2, f"bad config: {e}") from e
    except DataError as e:
        raise InputError(3, f"data error: {e}") from e
    if vocab > int(config["model"]["vocab_size"]):
        raise InputError(3, f"data error: {args.tokens[0]}: vocab {vocab} > model.vocab_size")
    return config, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata_jax.reference_train",
                                 description="monolithic JAX reference of the strata trainer")
    add_input_args(ap)
    ap.add_argument("--out", required=True, help="folder for losses.json and params.safetensors")
    ap.add_argument("--steps", type=int, default=None, help="override train.steps (schedule included)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--mesh", default=None,
                    help="one jit over a device mesh, e.g. data=2,tensor=2, sharded as the bench anchor's "
                         "(docs/parallelism.md); sets JAX's CPU device count to the mesh's")
    args = ap.parse_args(argv)
    mesh = None
    if args.mesh:
        try:
            mesh = mesh_for_cli(args.mesh, set_cpu_devices=True)
        except ParallelError as e:
            print(f"reference_train: {e}", file=sys.stderr)
            return 2
    try:
        config, tokens = load_inputs(ap, args)
    except InputError as e:
        print(f"reference_train: {e}", file=sys.stderr)
        return e.code
    try:
        params, hist = train(config, tokens, args.steps, None if args.quiet else print, mesh)
    except DataError as e:
        print(f"reference_train: data error: {e}", file=sys.stderr)
        return 3
    except ValueError as e:  # a bad model or optimizer config (ModelConfig, optimizers.assignment)
        print(f"reference_train: bad config: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "losses.json"), "w", encoding="utf-8") as f:
        json.dump(hist, f, indent=1)
        f.write("\n")
    save_params(params, os.path.join(args.out, "params.safetensors"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
