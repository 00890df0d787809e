"""Writes a program bundle (docs/bundle.md).

    python -m strata_jax.export --model-json FILE_OR_JSON --out DIR [--bundle-key KEY] [--mesh MESH] [--process-fsdp N]
        [--progress-fd FD]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import sys
from typing import Any

import jax
import jaxlib

from . import __version__
from . import kernels as K
from . import model as M
from . import optimizers as O
from . import parallel as PP
from . import registry as R
from . import tensor_parallel as TP
from .config import ModelConfig
from .programs import Program, _group_programs, build_programs, fsdp_programs, groups_of, kind_roles

SCHEMA_VERSION = 1


class ExportError(Exception):
    pass


class Progress:
    """"export: k/n programs" on a file descriptor: strata passes its own
    stderr (--progress-fd) when its progress display is on (docs/using.md,
    "Progress of long operations"); the exporter's stdout and stderr go to
    its log. Redrawn in place, the line ends with the last program."""

    def __init__(self, fd: int | None = None) -> None:
        self.out = os.fdopen(fd, "w", closefd=False) if fd is not None else None
        self.done = 0
        self.total = 0

    def tick(self) -> None:
        self.done += 1
        if self.out is None:
            return
        end = "\n" if self.done >= self.total else ""
        self.out.write(f"\rexport: {self.done}/{self.total} programs{end}")
        self.out.flush()


def lower_program(prog: Program) -> tuple[str, float]:
    """(StableHLO MLIR text, flops estimate or 0) of one program."""
    jitted = jax.jit(prog.fn, donate_argnums=prog.donated, keep_unused=True)
    lowered = jitted.lower(*(s.struct() for s in prog.inputs))
    outs = jax.tree_util.tree_leaves(lowered.out_info)
    got = [(tuple(o.shape), str(o.dtype)) for o in outs]
    want = [(s.shape, str(s.struct().dtype)) for s in prog.outputs]
    if got != want:
        raise ExportError(f"{prog.name}: outputs {got} do not match the contract {want}")
    text = lowered.as_text()
    if "func.func public @main(" not in text:
        raise ExportError(f"{prog.name}: lowered text has no public @main")
    return text, _flops(lowered)


def _flops(lowered: Any) -> float:
    try:  # HLO cost analysis of the lowered module: cheap, no compilation
        ca = lowered.cost_analysis()
        if isinstance(ca, (list, tuple)):
            ca = ca[0] if ca else {}
        return float(ca.get("flops", 0.0)) if ca else 0.0
    except Exception:  # noqa: BLE001 - flops are optional
        return 0.0


def param_table(cfg: ModelConfig) -> list[dict[str, Any]]:
    def entry(name: str, group: str, layer: int, local: str) -> dict[str, Any]:
        shape = M.param_shape(cfg, local, group)
        return {"name": name, "group": group, "layer": layer, "local": local, "shape": list(shape),
                "dtype": "f32", "init": M.param_init_text(cfg, local, group),
                "decay": len(shape) >= 2}

    rows = [entry(n, "embed", -1, n) for n in M.embed_param_names(cfg)]
    for i, kind in enumerate(cfg.layer_kinds()):
        k = R.KINDS[kind]
        rows += [entry(f"layers.{i}.{n}", k.group_name, i, n) for n in k.params(cfg)]
    rows += [entry(n, "head", -1, n) for n in M.head_param_names(cfg)]
    return rows


def program_tables(cfg: ModelConfig, names: set[str], fsdp: int = 1, tensor: int = 1,
                   process_fsdp: int = 1) -> dict[str, Any]:
    """Which program plays which role (docs/bundle.md, "Program tables").

    The C plan builder takes every program name from these tables and names
    none itself. Every name must be one of |names| (the exported programs).
    With fsdp > 1 each group also gets "shard_programs": its optimizer
    programs on one device's fsdp block of every tensor; so they do with
    process_fsdp > 1, fsdp across processes (each process one block of
    1/process_fsdp, its devices none of fsdp). With tensor > 1 the
    block's roles name the tensor-parallel SPMD programs (spmd_programs),
    and its accumulation a one-device program on the tensor-cut blocks.
    """
    embed = {"group": "embed", "programs": {"init": "embed_init", "fwd": "embed_fwd", "bwd": "embed_bwd",
                                            "prefill": "embed_prefill", "decode": "embed_decode"}}
    if "embed_accum_tied" in names:
        embed["programs"]["accum_tied"] = "embed_accum_tied"
    head = {"group": "head", "programs": {"init": "head_init", "loss": "head_loss", "eval": "head_eval",
                                          "logits": "head_logits"}}
    roles = {}
    for k in R.kinds_of(cfg):
        roles[k.name] = kind_roles(cfg, k)
        if tensor > 1:  # llama only (tensor_parallel._check_mesh)
            roles[k.name].update({r: f"tp_{roles[k.name][r]}" for r in ("fwd", "bwd", "fwd_res", "bwd_res")})
    layers = [{"index": i, "kind": kind, "group": R.KINDS[kind].group_name, "programs": dict(roles[kind])}
              for i, kind in enumerate(cfg.layer_kinds())]
    gnames = groups_of(cfg)
    # The update's role and program prefix: "adamw" (AdamW everywhere, no
    # optimizer object: today's tables) or "update" (docs/model.md, "Optimizers").
    upd = "adamw" if cfg.optimizer is None else "update"
    groups = [{"name": g, "params": list(M.group_param_names(cfg, g)),
               "programs": {"accum": f"accum_{g}", "sqnorm": f"sqnorm_{g}", upd: f"{upd}_{g}"}}
              for g in gnames]
    if fsdp == 1 and tensor == 1 and process_fsdp == 1:  # diag.numerics (docs/diagnostics.md): one device only
        for g in groups:
            g["programs"][f"{upd}_stats"] = f"{upd}_stats_{g['name']}"
        for row in layers:
            row["programs"]["act_stats"] = "act_stats"
    if tensor > 1 and fsdp == 1:  # fsdp x tensor has no optimizer programs yet (tensor_parallel.optimizer_programs)
        groups[gnames.index("block")]["programs"] = {"accum": f"accum_block_tp{tensor}", "sqnorm": "tp_sqnorm_block",
                                                     upd: f"tp_{upd}_block"}
    blocks = fsdp if fsdp > 1 else process_fsdp
    if blocks > 1:
        tail = f"_fsdp{blocks}" + (f"_tp{tensor}" if tensor > 1 else "")
        for g in groups:
            g["shard_programs"] = {r: f"{r}_{g['name']}{tail}" for r in ("accum", "sqnorm", upd)}
    for table in [embed, head, *layers, *groups]:
        for role, name in [*table["programs"].items(), *table.get("shard_programs", {}).items()]:
            if name not in names:
                raise ExportError(f"program table names {name!r} for {role!r}, which was not exported")
    return {"groups": groups, "embed": embed, "head": head, "layers": layers}


def default_bundle_key(cfg: ModelConfig) -> str:
    canon = json.dumps(cfg.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def build_bundle(cfg: ModelConfig, out_dir: str, bundle_key: str, mesh: Any = None,
                 progress: Progress | None = None, process_fsdp: int = 1) -> dict[str, Any]:
    """Writes programs/ and manifest.json into out_dir (which must exist); returns the manifest.

    With a mesh of more than one device (mesh.MeshSpec) the manifest also
    gets "mesh" and "collectives" (docs/parallelism.md), and with tensor > 1
    "spmd_programs", the tensor-parallel block programs (tensor_parallel.py);
    without one the bundle is exactly the one-device bundle. With
    |process_fsdp| > 1 (fsdp across processes, docs/multiprocess.md) the
    groups get shard_programs on blocks of 1/process_fsdp of each tensor
    (of each tensor block under tensor > 1), and the manifest says
    "process_fsdp"; the collectives between processes are strata's own."""
    K.fallbacks_seen.clear()  # this bundle's, recorded while its programs are traced
    prog_dir = os.path.join(out_dir, "programs")
    os.makedirs(prog_dir, exist_ok=True)
    entries = []
    progs = build_programs(cfg)
    fsdp = mesh.fsdp if mesh is not None and mesh.devices > 1 else 1
    tensor = mesh.tensor if mesh is not None and mesh.devices > 1 else 1
    if fsdp > 1 and process_fsdp > 1:
        raise ExportError(f"--process-fsdp {process_fsdp} with fsdp={fsdp} inside each process is not built")
    if fsdp > 1 or process_fsdp > 1:
        progs += fsdp_programs(cfg, fsdp if fsdp > 1 else process_fsdp, tensor, _tp_split_dim)
    if tensor > 1:
        progs += [_tp_accum_block(cfg, tensor)]
    # Every program is listed before the first is lowered, so the progress
    # line knows its total from the start.
    multi = mesh is not None and mesh.devices > 1
    tp_progs = _tp_program_list(cfg, mesh) if multi and mesh.tensor > 1 else []
    if multi:  # updates that need whole tensors, on fsdp blocks (docs/model.md, "Optimizers")
        tp_progs += TP.whole_update_programs(cfg, mesh, _tp_split_dim)
    coll_progs = _collective_list(cfg, mesh) if multi else []
    progress = progress if progress is not None else Progress()
    progress.total = len(progs) + len(tp_progs) + len(coll_progs)
    for prog in progs:
        text, flops = lower_program(prog)
        data = text.encode("utf-8")
        rel = f"programs/{prog.name}.mlir"
        with open(os.path.join(out_dir, rel), "wb") as f:
            f.write(data)
        entries.append({
            "name": prog.name, "file": rel, "sha256": hashlib.sha256(data).hexdigest(),
            "inputs": [s.to_json() for s in prog.inputs],
            "outputs": [s.to_json() for s in prog.outputs],
            "donated": list(prog.donated), "flops": int(flops),
        })
        progress.tick()
    spmd = _write_spmd_programs(tp_progs, mesh, out_dir, progress) if tp_progs else []
    tables = program_tables(cfg, {e["name"] for e in entries + spmd}, fsdp, tensor, process_fsdp)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "bundle_key": bundle_key,
        "exporter": {"name": "strata_jax", "version": __version__},
        "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__},
        "model": cfg.to_dict(),
        "programs": entries,
        "groups": tables["groups"],
        "params": param_table(cfg),
        "embed": tables["embed"],
        "head": tables["head"],
        "layers": tables["layers"],
        # After every program was lowered: the fallbacks taken while tracing them.
        "kernels": K.manifest_entry(dict(cfg.kernels)),
    }
    if process_fsdp > 1:
        manifest["process_fsdp"] = process_fsdp
    if mesh is not None and mesh.devices > 1:
        manifest["mesh"] = mesh.to_json()
        manifest["collectives"] = _export_collectives(cfg, coll_progs, mesh, out_dir, progress)
        if spmd:
            manifest["spmd_programs"] = spmd
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    return manifest


def _write_spmd_programs(progs: Any, mesh: Any, out_dir: str, progress: Progress) -> list[dict[str, Any]]:
    """Lowers each SPMD program over |mesh|, writes its text and returns its
    manifest entry (with the text's sha256)."""
    try:
        jmesh = PP.make_mesh(mesh)
        entries = []
        for prog in progs:
            data = prog.lower(jmesh).encode("utf-8")
            rel = f"programs/{prog.name}.mlir"
            with open(os.path.join(out_dir, rel), "wb") as f:
                f.write(data)
            e = prog.manifest_entry(rel)
            e["sha256"] = hashlib.sha256(data).hexdigest()
            entries.append(e)
            progress.tick()
        return entries
    except PP.ParallelError as e:
        raise ExportError(str(e)) from None


def _collective_list(cfg: ModelConfig, mesh: Any) -> list[Any]:
    try:
        return list(PP.bundle_collectives(cfg, mesh))
    except PP.ParallelError as e:
        raise ExportError(str(e)) from None


def _export_collectives(cfg: ModelConfig, progs: list[Any], mesh: Any, out_dir: str,
                        progress: Progress) -> list[dict[str, Any]]:
    entries = _write_spmd_programs(progs, mesh, out_dir, progress)
    for prog, e in zip(progs, entries):
        # The parameter group whose tensors it carries (bundle_collectives
        # names each program after its group), so C links it to the group.
        e["group"] = next(g for g in sorted(groups_of(cfg), key=len, reverse=True) if prog.name.startswith(g + "_"))
    return entries


def _tp_split_dim(group: str, name: str) -> int | None:
    """The dimension tensor parallelism cuts of a parameter (None: whole)."""
    return TP.PARAM_SPLIT_DIM[name] if group == "block" else None


def _tp_accum_block(cfg: ModelConfig, tensor: int) -> Program:
    """The block's gradient accumulation on one device's tensor-cut blocks
    (elementwise, so a one-device program on every device)."""
    def local(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        d = TP.PARAM_SPLIT_DIM[name]
        return shape if d is None else tuple(x // tensor if i == d else x for i, x in enumerate(shape))

    return next(p for p in _group_programs(cfg, "block", 1, local, f"_tp{tensor}") if p.name.startswith("accum_"))


def _tp_program_list(cfg: ModelConfig, mesh: Any) -> list[Any]:
    # The C trainer exports one device's share of a microbatch (the data
    # and fsdp cut); the SPMD programs take the whole microbatch and cut it
    # over data and fsdp themselves.
    cfg = dataclasses.replace(cfg, microbatch_size=cfg.microbatch_size * mesh.data * mesh.fsdp)
    try:
        return list(TP.tp_programs(cfg, mesh))
    except PP.ParallelError as e:
        raise ExportError(str(e)) from None


def export_bundle(cfg: ModelConfig, out: str, bundle_key: str | None = None, mesh: Any = None,
                  progress: Progress | None = None, process_fsdp: int = 1) -> dict[str, Any]:
    """Writes the bundle atomically: into <out>.tmp-<pid>, then renamed to <out> (replacing it)."""
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        manifest = build_bundle(cfg, tmp, bundle_key if bundle_key is not None else default_bundle_key(cfg), mesh, progress,
                                process_fsdp)
        if os.path.lexists(out):
            old = f"{out}.old-{os.getpid()}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _load_model_json(arg: str) -> ModelConfig:
    s = arg.strip()
    if not s.startswith("{"):
        with open(arg, encoding="utf-8") as f:
            s = f.read()
    d = json.loads(s)
    if isinstance(d.get("model"), dict):  # a whole resolved config: take its model section
        d = d["model"]
    return ModelConfig.from_dict(d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata_jax.export", description=__doc__.strip().splitlines()[0])
    ap.add_argument("--model-json", required=True, help="model config: a JSON file or a JSON string")
    ap.add_argument("--out", required=True, help="bundle folder to write (replaced atomically)")
    ap.add_argument("--bundle-key", default=None, help="echoed into manifest.json (default: hash of the model)")
    ap.add_argument("--mesh", default=None,
                    help="also export the collectives for a device mesh, e.g. data=2,fsdp=2 (docs/parallelism.md)")
    ap.add_argument("--process-fsdp", type=int, default=1,
                    help="fsdp spans this many processes: also export the optimizer programs on one process's "
                         "block of 1/N of each tensor (docs/multiprocess.md)")
    ap.add_argument("--progress-fd", type=int, default=None,
                    help="draw 'export: k/n programs' on this open file descriptor (strata passes its stderr)")
    args = ap.parse_args(argv)
    # strata ends an export it was told to stop with SIGTERM: as an
    # exception, so export_bundle removes its half-written folder.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.process_fsdp < 1:
        print(f"strata_jax.export: --process-fsdp {args.process_fsdp} is not a process count >= 1", file=sys.stderr)
        return 2
    mesh = None
    if args.mesh:
        try:
            mesh = PP.parse_mesh(args.mesh)
        except PP.ParallelError as e:
            print(f"strata_jax.export: {e}", file=sys.stderr)
            return 2
        # JAX lowers over as many CPU devices as the mesh has; its backend
        # reads XLA_FLAGS when it starts, which is after this point.
        flag = f"--xla_force_host_platform_device_count={mesh.devices}"
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    try:
        cfg = _load_model_json(args.model_json)
    except (OSError, ValueError, KeyError) as e:
        print(f"strata_jax.export: bad model config: {e}", file=sys.stderr)
        return 2
    if mesh is not None and mesh.devices > 1:
        with_metrics = [k.name for k in R.kinds_of(cfg) if k.metrics or k.family != "llama"]
        if with_metrics:
            # Their auxiliary losses are per data shard, and no kind with
            # metrics has collective or tensor-parallel programs yet; nor
            # has the gpt2 family (its embedding's wpe: not tried on a mesh).
            print(f"strata_jax.export: block kind {with_metrics[0]!r} (model.block/model.layers) does not run on "
                  f"a device mesh yet (--mesh {args.mesh}); set parallel.data, parallel.fsdp and parallel.tensor "
                  f"to 1 (docs/model.md, \"Block kinds\", moe)", file=sys.stderr)
            return 2
        kind_error = TP.unsupported_kind(cfg, mesh.tensor)
        if kind_error:
            print(f"strata_jax.export: {kind_error}", file=sys.stderr)
            return 2
    opt_error = O.unsupported_parallel(cfg, args.process_fsdp)
    if opt_error:
        print(f"strata_jax.export: {opt_error}", file=sys.stderr)
        return 2
    try:
        progress = Progress(args.progress_fd)
    except OSError as e:
        print(f"strata_jax.export: --progress-fd {args.progress_fd}: {e}", file=sys.stderr)
        return 2
    try:
        manifest = export_bundle(cfg, args.out, args.bundle_key, mesh, progress, args.process_fsdp)
    except ExportError as e:
        print(f"strata_jax.export: {e}", file=sys.stderr)
        return 1
    print(f"strata_jax.export: wrote {len(manifest['programs'])} programs to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
