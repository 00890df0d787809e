"""`make bench`: strata against the monolithic jax.jit anchors, one machine, one run.

Measures (docs/performance.md explains the method and shows the numbers):

  step      median step time of strata, the anchor with layers unrolled and
            the anchor with lax.scan over layers (jaxlib's CPU client), plus
            the unrolled anchor on strata's own PJRT plugin (same client as
            strata), on the tiny and small presets, in interleaved rounds;
            peak RSS of every process, strata's accounted peak live bytes
  compile   cold start (empty bundle and executable caches) for
            model.n_layers in {2, 8, 32} against both anchors' trace+lower
            and XLA compile times; strata's warm start (everything cached)
  overhead  strata and the unrolled anchor under `perf record`: CPU time of
            the host (main) thread per step against the step time, and how
            busy XLA's worker threads are
  remat     the 1-device step under sched.remat=auto (the default; no budget,
            and with a budget that makes it recompute), none and full, as
            ratios to none, and against the previous commit's strata built
            in a scratch folder (git archive + cmake; its default plan and
            full remat), all in interleaved rounds of one run
  parallel  each mesh of a list the trainer supports (1 device, data=2,
            data=4, fsdp=2, fsdp=4, tensor=2, data=2,tensor=2 on 4 CPU
            devices): strata's step time and accounted per-device peak bytes
            as ratios to the 1-device strata step and to the monolithic
            anchor jitted over the same mesh (anchor.py --mesh), and the
            communication overlap ratio (metrics comm_overlap_ratio) under
            the default policy, sched.wait=eager, sched.grad_reduce=bucketed
            (meshes with data > 1), sched.gather_prefetch=0 and
            sched.reshard_after_forward=false (meshes with fsdp > 1)
  pipeline  one device, parallel.pipeline=2 and 4 under each
            sched.pipeline_schedule (gpipe, 1f1b, interleaved with
            sched.pipeline_virtual=2) and fsdp=2 and 4 on the same 4 CPU
            devices (8 layers, 8 microbatches): step time as ratios to one
            device and to fsdp on as many devices, per-device peak bytes,
            each stage's busy time and peak bytes by category (metrics
            `pipeline.stage`, against the plan's prediction), the measured
            bubble next to the plan's and the theory's, sends and
            send_overlap_ratio
  packing   configs/tiny.yml on fortunes split into documents at `%` lines
            (data.separator), under each data.packing (concat, none, pack),
            in interleaved rounds: step time, tokens per second, the targets
            that count per second (metrics loss_weight / step time) and the
            batch fill's time (data_s) as a share of the step, with pack and
            none as ratios to concat
  multiprocess
            the same mesh (data=2, fsdp=2) on the same 2 cores as 1 process x
            2 devices and as 2 processes x 1 device (mpirun --oversubscribe
            -np 2): step time ratio, overlap ratio (comm_overlap_ratio in one
            process, xproc_overlap_ratio across processes), bytes crossing
            processes per step (xproc_bytes, against `strata plan --explain`)
            and MPI time per step (xproc_s, xproc_wait_s); a mesh the trainer
            refuses across processes (exit 2) is a "not built" row. Also the
            dist engine's all-reduce against message size on 2 ranks
            (build/mpi_coll_bench), an alpha-beta fit of it and the model's
            scaling estimate (docs/multiprocess.md). The single-process
            default path against the previous commit is the remat section's
            "previous default" run.
  extra     every other bench/bench_*.py, whose Markdown output is folded in

Results: bench/results/<date>-<host>.json and a Markdown section appended to
bench/results/README.md (both skipped with --no-save). Speed targets are
reported, never asserted.

    .venv/bin/python bench/run.py [--quick] [--sections step,compile,overhead,remat,parallel,pipeline,
        packing,multiprocess,extra]
        [--rounds N] [--no-save] [--base-commit REV | --no-previous]
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import flops as FL  # noqa: E402
import perfsplit  # noqa: E402

SECTIONS = ("step", "compile", "overhead", "remat", "parallel", "pipeline", "packing", "multiprocess", "extra")
OWN_HELPERS = {"bench_ckpt.py", "bench_memory.py", "bench_sched.py"}  # not special: listed here only for the docs' sake


@dataclass
class Preset:
    config: str
    overrides: list[str]
    steps: int   # steps per step-time run, warm-up included
    warmup: int  # leading steps left out of the medians
    diagnostics: bool = False  # also run the one-round diagnostic variants
    diag_steps: int = 0        # steps of a diagnostic run (0: same as steps)
    retry_s: float = 0         # at most this long re-running variants that never ran alone


@dataclass
class ParallelPreset:
    """The parallel section: every mesh on one client of `cpu_devices` CPU devices."""
    config: str
    overrides: list[str]
    steps: int
    warmup: int
    meshes: list[str]  # "1" (one device), "data=2", "fsdp=2", "data=2,tensor=2", ... (parse_mesh)
    rounds: int
    cpu_devices: int = 4  # runtime.cpu_devices; 0: not set (a GPU plugin's devices)
    strata_overrides: list[str] = field(default_factory=list)  # strata's alone (runtime.plugin=...)


@dataclass
class PipelinePreset:
    """The pipeline section: one device, each pipeline (stages x schedule)
    and fsdp over as many devices as each pipeline, on one client of
    `cpu_devices` CPU devices. Every variant trains the same global batch in
    the same microbatches (the config's), so only the placement differs."""
    config: str
    overrides: list[str]
    steps: int
    warmup: int
    rounds: int
    stages: list[int]     # parallel.pipeline values; each also gives an fsdp=P baseline
    schedules: list[str]  # sched.pipeline_schedule values
    virtual: int = 2      # sched.pipeline_virtual of the interleaved schedule
    cpu_devices: int = 4


@dataclass
class PackingPreset:
    """The packing section: one model on one corpus split into documents
    (`overrides` set data.separator), trained under each data.packing mode.
    Every variant draws the same number of sequences of the same length, so
    the step shapes are equal and only the batches' contents differ."""
    config: str
    overrides: list[str]
    steps: int
    warmup: int
    rounds: int
    modes: list[str] = field(default_factory=lambda: list(PACKING_MODES))


@dataclass
class RematPreset:
    """The remat section: the 1-device step under each sched.remat choice,
    and the previous commit's strata on the same preset."""
    config: str
    overrides: list[str]
    steps: int
    warmup: int
    rounds: int
    previous: bool = True  # build the previous commit and time it too


@dataclass
class MultiprocPreset:
    """The multiprocess section: each mesh as 1 process x N devices and as N
    processes x 1 device, and the all-reduce sweep of the alpha-beta fit."""
    config: str
    overrides: list[str]
    steps: int
    warmup: int
    rounds: int
    meshes: list[str]        # parse_mesh strings over 2 devices: "data=2", "fsdp=2"
    sweep_max_bytes: int     # mpi_coll_bench's largest all-reduce
    scale: tuple[str, list[str]]  # the config whose gradients the scaling estimate moves
    refused_alone: bool = True  # time a mesh's 1-process runs even when its job is refused (not --quick: an export)


@dataclass
class Plan:
    """What to run; --quick shrinks everything to check the pipeline in a minute or two."""
    presets: dict[str, Preset]
    rounds: int          # interleaved rounds of the main variants
    # A shared machine: a main variant whose every run shared the CPUs with
    # other processes (other_load > quiet_load) is run again, for at most
    # the preset's retry_s.
    quiet_load: float
    depth_config: tuple[str, list[str]]
    depths: list[int]
    compile_rounds: int  # cold/warm starts and anchor compiles per depth; the fastest counts
    overhead_preset: str
    overhead_steps: int
    overhead_warmup: int
    extra_timeout_s: int
    parallel: ParallelPreset | None = None
    pipeline: PipelinePreset | None = None
    packing: PackingPreset | None = None
    remat: RematPreset | None = None
    multiproc: MultiprocPreset | None = None


# The pipeline section's model: the test model at 8 layers (P=4 x V=2 is
# one layer per chunk), 8 microbatches of 4 rows (fsdp=4 cuts a microbatch's
# rows; interleaved needs the microbatches divisible by P), every
# activation kept (sched.remat=none), so the stages' activation peaks are
# the schedules' own.
PIPELINE_MODEL = ["model.n_layers=8", "train.batch_size=32", "train.microbatches=8", "sched.remat=none"]
PIPELINE_SCHEDULES = ["gpipe", "1f1b", "interleaved"]

# The packing section: concat first, the baseline of the ratios.
PACKING_MODES = ["concat", "none", "pack"]

# GPT-2 small (configs/gpt2-124m.yml) at a short context: its shape (12
# layers of 768, vocabulary 50257 padded to 50304) at seq 64 and batch 4,
# 256 tokens a step, on synthetic tokens (the preset's BPE needs a corpus).
GPT2_SHORT = ["model.seq_len=64", "train.batch_size=4", "train.microbatches=1", "data.synthetic=true",
              "data.tokenizer=byte"]

FULL = Plan(
    presets={"tiny": Preset("configs/tiny.yml", [], steps=25, warmup=5, retry_s=45),
             "small": Preset("configs/small.yml", [], steps=23, warmup=3, diagnostics=True, diag_steps=13,
                             retry_s=120),
             "gpt2-124m": Preset("configs/gpt2-124m.yml", GPT2_SHORT, steps=8, warmup=2)},
    rounds=2, quiet_load=0.25,
    depth_config=("configs/small.yml", []), depths=[2, 8, 32], compile_rounds=2,
    overhead_preset="small", overhead_steps=14, overhead_warmup=3,
    extra_timeout_s=420,
    parallel=ParallelPreset("configs/tiny.yml", [], steps=20, warmup=5, rounds=2,
                            meshes=["1", "data=2", "data=4", "fsdp=2", "fsdp=4", "tensor=2", "data=2,tensor=2",
                                    "data=2,fsdp=2", "fsdp=2,tensor=2"]),
    pipeline=PipelinePreset("configs/test.yml", PIPELINE_MODEL, steps=20, warmup=5, rounds=2, stages=[2, 4],
                            schedules=PIPELINE_SCHEDULES),
    packing=PackingPreset("configs/tiny.yml", ["data.separator=%"], steps=25, warmup=5, rounds=3),
    remat=RematPreset("configs/tiny.yml", [], steps=20, warmup=5, rounds=3),
    multiproc=MultiprocPreset("configs/tiny.yml", [], steps=20, warmup=5, rounds=2, meshes=["data=2", "fsdp=2"],
                              sweep_max_bytes=64 << 20, scale=("configs/gpt2-124m.yml", GPT2_SHORT)),
)
QUICK = Plan(
    presets={"test": Preset("configs/test.yml", [], steps=8, warmup=2, diagnostics=True)},
    rounds=1, quiet_load=0.25,
    depth_config=("configs/test.yml", []), depths=[2, 4], compile_rounds=1,
    overhead_preset="test", overhead_steps=8, overhead_warmup=2,
    extra_timeout_s=120,
    # batch 8 in 2 microbatches: 4 rows, which data=2 and fsdp=2 can cut
    parallel=ParallelPreset("configs/test.yml", ["train.batch_size=8"], steps=6, warmup=2, rounds=1,
                            meshes=["1", "data=2", "fsdp=2", "tensor=2"]),
    pipeline=PipelinePreset("configs/test.yml", PIPELINE_MODEL, steps=8, warmup=3, rounds=1, stages=[2, 4],
                            schedules=PIPELINE_SCHEDULES),
    # test.yml's model on the fortunes corpus (not its synthetic tokens, which have no documents), at a
    # sequence length that leaves pack some padding
    packing=PackingPreset("configs/test.yml", ["data.synthetic=false", "data.separator=%", "model.seq_len=64"],
                          steps=8, warmup=2, rounds=1),
    remat=RematPreset("configs/test.yml", [], steps=8, warmup=2, rounds=1),
    multiproc=MultiprocPreset("configs/test.yml", ["train.batch_size=8"], steps=6, warmup=2, rounds=1,
                              meshes=["data=2", "fsdp=2"], sweep_max_bytes=1 << 20, scale=("configs/test.yml", []),
                              refused_alone=False),
)

# Every kernel op at xla in this build's strata runs: the sections here set
# strata against jax.jit anchors, which run plain jnp fused by XLA, so strata
# must run the same math (kernels.<op>=auto, the default, takes strata's C
# kernels on a CPU plugin). bench/bench_kernels.py measures ffi against xla.
# First, so that a section's own overrides still win.
KERNELS_XLA = [f"kernels.{op}=xla" for op in ("rmsnorm", "swiglu", "cross_entropy", "attention")]

# The packing section has no anchor: it runs strata's default kernels
# (kernels.<op>=auto: ffi on a CPU plugin, the attention's segment form
# under pack), which is what a user of packing gets. A kernel override for
# every variant goes here.
PACKING_KERNELS: list[str] = []

# The malloc policy strata's runtime applies to itself (docs/runtime.md,
# "Host allocator"), for the anchor's like-for-like diagnostic run.
MALLOC_TUNABLES = "glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824"


# --- small pure helpers (tests/py/test_bench.py) -------------------------------

def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def read_jsonl(path: str) -> list[dict[str, Any]]:
    out = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by a kill: the rest of the file still counts
    return out


def step_metrics(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Training step lines only (eval lines carry eval_loss and no step_time_s)."""
    return [m for m in metrics if isinstance(m.get("step_time_s"), (int, float)) and "eval_loss" not in m]


def strata_step_summary(metrics: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Median step time after warm-up and the host share of it, read
    defensively: fields other than step_time_s may be absent or renamed."""
    steps = step_metrics(metrics)[warmup:]
    times = [m["step_time_s"] for m in steps]
    out: dict[str, Any] = {"n": len(times), "median_s": median(times),
                           "min_s": min(times) if times else None, "max_s": max(times) if times else None}
    waits = [m.get("wait_s") for m in steps]
    if times and all(isinstance(w, (int, float)) for w in waits):
        host = [t - w for t, w in zip(times, waits)]  # type: ignore[operator]
        out["host_s_median"] = median(host)
        out["host_fraction"] = median([h / t for h, t in zip(host, times) if t > 0])
    peaks = [m.get("peak_live_bytes") for m in step_metrics(metrics)]
    peaks = [p for p in peaks if isinstance(p, (int, float))]
    out["peak_live_bytes"] = int(max(peaks)) if peaks else None
    launches = [m.get("launches") for m in steps if isinstance(m.get("launches"), (int, float))]
    out["launches_per_step"] = int(median(launches)) if launches else None  # type: ignore[arg-type]
    return out


def events_by_name(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The first event of each name."""
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        out.setdefault(str(e.get("event")), e)
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def fmt(x: Any, unit: str = "", digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}{unit}" if abs(x) < 1000 else f"{x:.0f}{unit}"
    return f"{x}{unit}"


def fmt_bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "–"
    return f"{n / 2**20:.0f} MiB"


def fmt_size(n: Any) -> str:
    """Bytes in the unit that keeps three figures: the parallel section's test preset lives in KiB."""
    if not isinstance(n, (int, float)):
        return "–"
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{n / 2**10:.3g} KiB"


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def target_line(name: str, value: float | None, limit: float, better: str, unit: str = "") -> dict[str, Any]:
    """better: 'le' (value <= limit passes) or 'ge'."""
    if value is None:
        return {"target": name, "value": None, "limit": limit, "met": None}
    met = value <= limit if better == "le" else value >= limit
    return {"target": name, "value": value, "limit": limit, "met": met, "unit": unit}


# --- processes -----------------------------------------------------------------

def _proc_stat_busy() -> float:
    """Busy CPU seconds of the whole machine since boot (all CPUs)."""
    with open("/proc/stat", encoding="ascii") as f:
        parts = f.readline().split()[1:]
    v = [int(x) for x in parts]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class ProcResult:
    rc: int
    wall_s: float
    maxrss_bytes: int
    cpu_s: float
    other_load: float  # CPUs kept busy by *other* processes during the run (0..ncpu)
    start_unix: float
    stderr_tail: str
    minor_faults: int = 0
    killed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def proc_cpu_and_faults(pid: int) -> tuple[float, int] | None:
    """(CPU seconds of all threads, minor faults) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the command name: state(0) ... minflt(7) ... utime(11) stime(12)
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, int(fields[7])


class StepWindow:
    """Polled while strata trains: snapshots the process's CPU time and minor
    faults when metrics.jsonl reaches `first` step lines and again at `last`,
    so the two cover the steady-state steps only (±one 20 ms poll)."""

    def __init__(self, metrics_path: str, first: int, last: int) -> None:
        self.path, self.first, self.last = metrics_path, first, last
        self.start: tuple[float, int] | None = None
        self.end: tuple[float, int] | None = None

    def __call__(self, pid: int) -> None:
        if self.end is not None or not os.path.exists(self.path):
            return
        with open(self.path, "rb") as f:
            n = f.read().count(b'"step_time_s"')
        if self.start is None and n >= self.first:
            self.start = proc_cpu_and_faults(pid)
        elif self.start is not None and n >= self.last:
            self.end = proc_cpu_and_faults(pid)

    def per_step(self) -> dict[str, float | None]:
        if not self.start or not self.end or self.last <= self.first:
            return {"cpu_s_per_step": None, "minor_faults_per_step": None}
        n = self.last - self.first
        return {"cpu_s_per_step": (self.end[0] - self.start[0]) / n,
                "minor_faults_per_step": (self.end[1] - self.start[1]) / n}


def run_proc(cmd: list[str], env: dict[str, str], timeout_s: float, stop_when: Callable[[], bool] | None = None,
             log: str | None = None, sampler: Callable[[int], None] | None = None) -> ProcResult:
    """Runs cmd; returns its own peak RSS and CPU time (os.wait4, so per
    process, children that it waited for included) and how much CPU other
    processes used meanwhile. stop_when, polled every 20 ms, ends the run with
    SIGTERM once it returns True (a cold start needs no training)."""
    errf = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
    busy0, t0, start_unix = _proc_stat_busy(), time.monotonic(), time.time()
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL if not log else open(log, "w"),
                         stderr=errf)
    killed = False
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - t0 > timeout_s:
            p.kill()
            killed = True
        elif stop_when is not None and not killed and stop_when():
            p.send_signal(signal.SIGTERM)
            killed = True
        if sampler is not None:
            sampler(p.pid)
        time.sleep(0.02)
    wall = time.monotonic() - t0
    busy = _proc_stat_busy() - busy0
    p.returncode = os.waitstatus_to_exitcode(status)
    cpu = ru.ru_utime + ru.ru_stime
    other = max(0.0, (busy - cpu) / wall) if wall > 0 else 0.0
    errf.seek(0)
    tail = errf.read()[-2000:]
    errf.close()
    return ProcResult(p.returncode, wall, int(ru.ru_maxrss) * 1024, cpu, other, start_unix, tail,
                      int(ru.ru_minflt), killed)


class StrataFailed(RuntimeError):
    """A strata run that exited non-zero; rc is its exit code (2: a config strata refuses)."""

    def __init__(self, message: str, rc: int) -> None:
        super().__init__(message)
        self.rc = rc


class Bench:
    def __init__(self, plan: Plan, work: str, log: Callable[[str], None], strata: str | None = None) -> None:
        self.plan, self.work, self.log = plan, work, log
        self.strata = strata or os.environ.get("STRATA_BIN", os.path.join(ROOT, "build", "strata"))
        self.python = sys.executable
        self.cache = os.path.join(work, "cache")  # warm bundle/executable/token cache
        self.env = {**os.environ, "STRATA_CACHE_DIR": self.cache, "STRATA_BIN": self.strata,
                    "PYTHONPATH": os.path.join(ROOT, "python"),
                    "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1")}
        # An inherited XLA flag would apply to the anchors only; a platform
        # list would hide strata's plugin from the anchor.
        self.env.pop("XLA_FLAGS", None)
        self.env.pop("JAX_PLATFORMS", None)
        self.plugin = self._plugin_path()
        self.n = 0
        self.base_commit: str | None = None  # the remat section's previous commit (None: HEAD^, or HEAD if dirty)

    def _plugin_path(self) -> str | None:
        r = subprocess.run([self.python, "-c", "import lammps_jax_pjrt_cpu as p; print(p.PLUGIN_PATH)"],
                           capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None

    def tmp(self, name: str) -> str:
        self.n += 1
        return os.path.join(self.work, f"{self.n:03d}-{name}")

    # --- one strata run ---
    def strata_train(self, config: str, overrides: list[str], name: str, env: dict[str, str] | None = None,
                     stop_at_run: bool = False, timeout_s: float = 900, perf: str | None = None,
                     window: tuple[int, int] | None = None, strata: str | None = None,
                     launcher: list[str] | None = None, kernels_xla: bool = True) -> dict[str, Any]:
        """window: (first, last) step lines between which CPU time and page
        faults are sampled (not with perf: then the process is perf's).
        strata: another build's binary (the remat section's previous commit).
        launcher: a command the run is started under (mpirun ... -np 2):
        the run dir is then rank 0's, the job's. kernels_xla=False: the
        config's kernels (KERNELS_XLA not pinned; the packing section)."""
        run_dir = self.tmp(name)
        # The previous commit's build (strata=) keeps its own defaults.
        pin = KERNELS_XLA if kernels_xla and (strata or self.strata) == self.strata else []
        cmd = [strata or self.strata, "train", config, *pin, *overrides, f"run.dir={run_dir}", "run.progress=off"]
        if perf:
            cmd = perfsplit.record_prefix(perf) + cmd
        if launcher:
            cmd = [*launcher, *cmd]
        events_path = os.path.join(run_dir, "events.jsonl")

        def at_run() -> bool:
            return any(e.get("event") == "run" for e in read_jsonl(events_path))

        sw = StepWindow(os.path.join(run_dir, "metrics.jsonl"), *window) if window and not perf else None
        pr = run_proc(cmd, env or self.env, timeout_s, at_run if stop_at_run else None, sampler=sw)
        if sw is not None:
            pr.extra.update(sw.per_step())
        events = read_jsonl(events_path)
        ok = pr.rc == 0 or (stop_at_run and pr.killed and "run" in events_by_name(events))
        if not ok:
            raise StrataFailed(f"{' '.join(cmd)} exited {pr.rc}:\n{pr.stderr_tail}", pr.rc)
        return {"proc": pr, "events": events, "metrics": read_jsonl(os.path.join(run_dir, "metrics.jsonl")),
                "run_dir": run_dir}

    # --- one anchor run ---
    def anchor(self, config: str | None, overrides: list[str], variant: str, name: str, steps: int | None,
               plugin: bool = False, compile_only: bool = False, perf: str | None = None,
               timeout_s: float = 900, inputs: tuple[str, str] | None = None,
               env: dict[str, str] | None = None, mesh: str | None = None) -> dict[str, Any]:
        """inputs: (resolved config JSON file, token file) instead of config + overrides."""
        out = self.tmp(name) + ".json"
        src = ["--config-json", inputs[0], "--tokens", inputs[1]] if inputs else [config or "", *overrides]
        cmd = [self.python, "-m", "strata_jax.anchor", *src, "--variant", variant, "--out", out]
        if steps is not None:
            cmd += ["--steps", str(steps)]
        if compile_only:
            cmd.append("--compile-only")
        if mesh:
            cmd += ["--mesh", mesh]  # one jit over that many of jaxlib's CPU devices (anchor.py sets XLA_FLAGS)
        if plugin:
            if not self.plugin:
                raise RuntimeError("strata's CPU plugin (lammps_jax_pjrt_cpu) is not installed in this Python")
            cmd += ["--plugin", self.plugin, "--cpu-devices", "2"]  # as runtime.cpu_devices's default
        if perf:
            cmd = perfsplit.record_prefix(perf) + cmd
        pr = run_proc(cmd, env or self.env, timeout_s)
        if pr.rc != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {pr.rc}:\n{pr.stderr_tail}")
        with open(out, encoding="utf-8") as f:
            res = json.load(f)
        return {"proc": pr, "result": res}


# --- sections ------------------------------------------------------------------

def resolved_config(b: Bench, config: str, overrides: list[str]) -> dict[str, Any]:
    r = subprocess.run([b.strata, "config", "--json", config, *overrides], cwd=ROOT, env=b.env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"strata config {config} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


@dataclass
class Variant:
    name: str
    kind: str  # "strata" | "anchor"
    overrides: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    anchor: str = ""  # unroll | scan
    plugin: bool = False
    diagnostic: bool = False  # one round only, not in the targets


# Diagnostics (one round, the preset marked diagnostics=True): each isolates
# one cause of a step-time difference (docs/performance.md, "Why").
def variants_for(b: Bench, preset: Preset, cfg: dict[str, Any]) -> list[Variant]:
    v = [Variant("strata", "strata"), Variant("unroll", "anchor", anchor="unroll"),
         Variant("scan", "anchor", anchor="scan")]
    if not preset.diagnostics:
        return v
    # The anchors keep every activation. strata's default (sched.remat=auto
    # without a memory budget) keeps every layer's residuals too; the other
    # remat choice, one round, shows what recomputing costs (or saves).
    sched = cfg.get("sched", {})
    remat = sched.get("remat")
    keeps_all = remat == "none" or (remat == "auto" and str(sched.get("memory_budget", "0")) == "0")
    other = "full" if keeps_all else "none"
    if remat is not None:
        try:
            resolved_config(b, preset.config, [*preset.overrides, f"sched.remat={other}"])
            v.append(Variant(f"strata sched.remat={other}", "strata", [f"sched.remat={other}"], diagnostic=True))
        except RuntimeError:
            pass
    # strata's host malloc policy off (as the anchors run by default) ...
    v.append(Variant("strata malloc=glibc default", "strata", env={"STRATA_MALLOC_TUNING": "0"}, diagnostic=True))
    # ... and on for the anchor
    v.append(Variant("unroll malloc=strata's", "anchor", anchor="unroll", env={"GLIBC_TUNABLES": MALLOC_TUNABLES},
                     diagnostic=True))
    # the same XLA client as strata: its PJRT plugin, 2 devices
    if b.plugin:
        v.append(Variant("unroll on strata's plugin", "anchor", anchor="unroll", plugin=True, diagnostic=True))
    return v


def run_variant(b: Bench, preset_name: str, preset: Preset, v: Variant, common: list[str]) -> dict[str, Any]:
    env = {**b.env, **v.env}
    if v.diagnostic and preset.diag_steps:
        preset = Preset(preset.config, preset.overrides, preset.diag_steps, preset.warmup)
    tag = "step-" + "".join(c if c.isalnum() or c in "-." else "_" for c in f"{preset_name}-{v.name}")
    if v.kind == "strata":
        r = b.strata_train(preset.config, [*common, *v.overrides, f"train.steps={preset.steps}"], tag, env=env,
                           window=(preset.warmup, preset.steps))
        s = strata_step_summary(r["metrics"], preset.warmup)
        s.update(r["proc"].extra)
    else:
        r = b.anchor(preset.config, common, v.anchor, tag, preset.steps, plugin=v.plugin, env=env)
        x = r["result"]
        t = x["step_time_s"][preset.warmup:]
        cpu = x.get("step_cpu_s", [])[preset.warmup:]
        flt = x.get("step_minor_faults", [])[preset.warmup:]
        s = {"n": len(t), "median_s": median(t), "min_s": min(t) if t else None, "max_s": max(t) if t else None,
             "client": x.get("client"), "compile_s": x.get("compile_s"),
             "xla_peak_bytes_estimate": (x.get("memory") or {}).get("peak_bytes_estimate"),
             "cpu_s_per_step": sum(cpu) / len(cpu) if cpu else None,
             "minor_faults_per_step": sum(flt) / len(flt) if flt else None}
    pr: ProcResult = r["proc"]
    s.update({"maxrss_bytes": pr.maxrss_bytes, "wall_s": pr.wall_s, "other_load": round(pr.other_load, 3)})
    return s


def section_step(b: Bench) -> dict[str, Any]:
    p = b.plan
    out: dict[str, Any] = {"rounds": p.rounds, "quiet_load": p.quiet_load, "presets": {}}
    for name, preset in p.presets.items():
        b.log(f"step: {name}: warming the bundle and executable caches")
        b.strata_train(preset.config, [*preset.overrides, "train.steps=1", "train.eval_batches=1"], f"warm-{name}")
        cfg = resolved_config(b, preset.config, preset.overrides)
        vs = variants_for(b, preset, cfg)
        runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in vs}
        common = [*preset.overrides, "train.eval_every=0", "train.eval_batches=1"]
        res_errors: dict[str, str] = {}
        for rnd in range(p.rounds):
            for v in vs:
                if v.diagnostic and rnd > 0:
                    continue
                b.log(f"step: {name}: round {rnd + 1}/{p.rounds}: {v.name}")
                try:
                    s = run_variant(b, name, preset, v, common)
                except RuntimeError as e:
                    if not v.diagnostic:
                        raise
                    b.log(f"step: {name}: {v.name} failed (a diagnostic: the section goes on): {e}")
                    res_errors[v.name] = str(e)[-1500:]
                    continue
                s["round"] = rnd
                runs[v.name].append(s)
        retries, t_retry = 0, time.monotonic()
        while time.monotonic() - t_retry < preset.retry_s:
            # main variants first, then the diagnostics
            noisy = sorted((v for v in vs
                            if runs[v.name] and min(r["other_load"] for r in runs[v.name]) > p.quiet_load),
                           key=lambda v: v.diagnostic)
            if not noisy:
                break
            v = noisy[0]
            b.log(f"step: {name}: {v.name} again: every run so far shared the CPUs (other load "
                  f"{min(r['other_load'] for r in runs[v.name]):.2f} > {p.quiet_load})")
            try:
                s = run_variant(b, name, preset, v, common)
            except RuntimeError as e:
                if not v.diagnostic:
                    raise
                res_errors[v.name] = str(e)[-1500:]
                break
            s["round"] = -1  # a retry
            runs[v.name].append(s)
            retries += 1
        res: dict[str, Any] = {"config": preset.config, "overrides": preset.overrides, "steps": preset.steps,
                               "warmup": preset.warmup, "diag_steps": preset.diag_steps or preset.steps,
                               "retries": retries, "errors": res_errors,
                               "model_flops_per_step": FL.step_flops(cfg),
                               "tokens_per_step": int(cfg["train"]["batch_size"]) * int(cfg["model"]["seq_len"]),
                               "diagnostic": [v.name for v in vs if v.diagnostic], "runs": runs, "best": {}}
        # Other processes only ever slow a run down, so each variant is
        # represented by its fastest run's median (every run is kept).
        for v, rs in runs.items():
            ok = [r for r in rs if r.get("median_s") is not None]
            if not ok:
                continue
            best = min(ok, key=lambda r: r["median_s"])
            cpus = [r["cpu_s_per_step"] for r in ok if r.get("cpu_s_per_step") is not None]
            res["best"][v] = {"median_s": best["median_s"], "all_medians_s": [r["median_s"] for r in ok],
                              "cpu_s_per_step": min(cpus) if cpus else None,
                              "minor_faults_per_step": best.get("minor_faults_per_step"),
                              "maxrss_bytes": max(r["maxrss_bytes"] for r in ok)}
        bs = res["best"].get("strata", {})
        res["ratio"] = {v: ratio(bs.get("median_s"), d["median_s"]) for v, d in res["best"].items() if v != "strata"}
        res["cpu_ratio"] = {v: ratio(bs.get("cpu_s_per_step"), d["cpu_s_per_step"])
                            for v, d in res["best"].items() if v != "strata"}
        # The same ratio per round, from runs made minutes apart: its spread is the noise.
        def rounds_of(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [r for r in rs if r["round"] >= 0]
        res["ratio_per_round"] = {
            v: [x for x in (ratio(a.get("median_s"), c.get("median_s"))
                            for a, c in zip(rounds_of(runs["strata"]), rounds_of(rs))) if x is not None]
            for v, rs in runs.items() if v != "strata"}
        out["presets"][name] = res
    return out


def _strata_start(b: Bench, config: str, ov: list[str], name: str, env: dict[str, str]) -> dict[str, Any]:
    r = b.strata_train(config, ov, name, env=env, stop_at_run=True)
    ev = events_by_name(r["events"])
    pr: ProcResult = r["proc"]
    comp = ev.get("compile", {})
    d: dict[str, Any] = {
        "startup_s": ev.get("run", {}).get("startup_seconds"),
        "to_first_step_wall_s": (ev["run"]["time"] - pr.start_unix) if "run" in ev else None,
        "compile_s": comp.get("seconds"),
        "programs_compiled": comp.get("compiled"),
        "cache_hits": comp.get("cache_hits"),
        "compile_threads": comp.get("threads"),
        "program_seconds": comp.get("program_seconds"),
        "exported": ev.get("bundle", {}).get("exported"),
        "maxrss_bytes": pr.maxrss_bytes, "other_load": round(pr.other_load, 3),
    }
    if "bundle" in ev:
        # process start -> bundle ready: exec, config, data (cached), export, runtime
        d["before_compile_s"] = ev["bundle"]["time"] - pr.start_unix
    if "compile" in ev and "run" in ev:
        # running the init programs (compiled with the rest) + zeroed optimizer state
        d["init_s"] = ev["run"]["time"] - ev["compile"]["time"]
    return d


def _best(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The fastest run (other processes only ever slow a run down), with every run's figure."""
    ok = [r for r in runs if r.get(key) is not None]
    best = dict(min(ok, key=lambda r: r[key]) if ok else runs[0])
    best["runs"] = [r.get(key) for r in runs]
    return best


def section_compile(b: Bench) -> dict[str, Any]:
    p = b.plan
    config, over = p.depth_config
    # Token files are data, not compile caches: seed each empty cache with them
    # so a cold start does not also time tokenizing the corpus.
    b.strata_train(config, [*over, "train.steps=1", "train.eval_batches=1"], "tokens")
    tokens_src = os.path.join(b.cache, "tokens")
    out: dict[str, Any] = {"config": config, "overrides": over, "rounds": p.compile_rounds, "depths": {}}
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {n: {} for n in p.depths}
    # Rounds alternate the depth order (2, 8, 32, then 32, 8, 2): a machine
    # that drifts slower over the section then cannot fake a depth trend.
    for rnd in range(p.compile_rounds):
        prev_cache = None  # the previous depth's cache in this round: a depth sweep's next run
        for n in (p.depths if rnd % 2 == 0 else list(reversed(p.depths))):
            cold_cache = os.path.join(b.work, f"cold-cache-{n}-{rnd}")
            shutil.rmtree(cold_cache, ignore_errors=True)
            os.makedirs(cold_cache)
            if os.path.isdir(tokens_src):
                shutil.copytree(tokens_src, os.path.join(cold_cache, "tokens"))
            env = {**b.env, "STRATA_CACHE_DIR": cold_cache}
            ov = [*over, f"model.n_layers={n}", "train.steps=1", "train.eval_batches=1"]
            if prev_cache:
                # The bundle and executables of another depth: no program
                # depends on the depth, so nothing should export or compile.
                b.log(f"compile: round {rnd + 1}, n_layers={n}: strata after another depth")
                runs[n].setdefault("strata_new_depth", []).append(
                    _strata_start(b, config, ov, f"compile-{n}-newdepth-{rnd}",
                                  {**b.env, "STRATA_CACHE_DIR": prev_cache}))
            for kind in ("cold", "warm"):
                b.log(f"compile: round {rnd + 1}, n_layers={n}: strata {kind}")
                runs[n].setdefault(f"strata_{kind}", []).append(
                    _strata_start(b, config, ov, f"compile-{n}-{kind}-{rnd}", env))
            prev_cache = cold_cache
            for v in ("unroll", "scan"):
                b.log(f"compile: round {rnd + 1}, n_layers={n}: anchor {v}")
                r = b.anchor(config, [*over, f"model.n_layers={n}"], v, f"compile-{n}-{v}-{rnd}", None,
                             compile_only=True)
                res = r["result"]
                runs[n].setdefault(v, []).append(
                    {"lower_s": res["lower_s"], "compile_s": res["compile_s"], "init_s": res["init_s"],
                     "lower_plus_compile_s": res["lower_s"] + res["compile_s"],
                     "process_wall_s": r["proc"].wall_s, "maxrss_bytes": r["proc"].maxrss_bytes,
                     "other_load": round(r["proc"].other_load, 3)})
    for n in p.depths:
        rs = runs[n]
        out["depths"][str(n)] = {"strata_cold": _best(rs["strata_cold"], "startup_s"),
                                 "strata_warm": _best(rs["strata_warm"], "startup_s"),
                                 "strata_new_depth": (_best(rs["strata_new_depth"], "startup_s")
                                                      if rs.get("strata_new_depth") else None),
                                 "unroll": _best(rs["unroll"], "lower_plus_compile_s"),
                                 "scan": _best(rs["scan"], "lower_plus_compile_s")}
    return out


def _offset() -> float:
    """realtime - monotonic: events carry wall-clock times, perf CLOCK_MONOTONIC ones."""
    return time.time() - time.monotonic()


def section_overhead(b: Bench) -> dict[str, Any]:
    p = b.plan
    why = perfsplit.available()
    pre = p.presets[p.overhead_preset]
    common = [*pre.overrides, "train.eval_every=0", "train.eval_batches=1", f"train.steps={p.overhead_steps}"]
    out: dict[str, Any] = {"preset": p.overhead_preset, "steps": p.overhead_steps, "warmup": p.overhead_warmup,
                           "perf_unavailable": why}
    off = _offset()
    ncpu = os.cpu_count() or 1
    b.log("overhead: strata" + ("" if why else " under perf"))
    data = None if why else b.tmp("perf-strata.data")
    r = b.strata_train(pre.config, common, "overhead-strata", perf=data)
    # Metrics-only figure (no perf needed): step time minus time blocked in reads.
    out["metrics"] = strata_step_summary(r["metrics"], p.overhead_warmup)
    if data:
        ev = events_by_name(r["events"])
        times = [m["step_time_s"] for m in step_metrics(r["metrics"])]
        t0 = ev["run"]["time"] + sum(times[:p.overhead_warmup])
        t1 = ev["run"]["time"] + sum(times)
        n_steps = len(times) - p.overhead_warmup
        out["strata"] = _overhead_summary(_split_busiest(data, t0 - off, t1 - off), n_steps,
                                          median(times[p.overhead_warmup:]), ncpu)
        b.log("overhead: unrolled anchor under perf")
        data = b.tmp("perf-anchor.data")
        r = b.anchor(pre.config, common[:-1], "unroll", "overhead-anchor", p.overhead_steps, perf=data)
        res = r["result"]
        st, tt = res["step_start_unix"], res["step_time_s"]
        sp = _split_busiest(data, st[p.overhead_warmup] - off, st[-1] + tt[-1] - off)
        out["unroll"] = _overhead_summary(sp, len(tt) - p.overhead_warmup, median(tt[p.overhead_warmup:]), ncpu)
    # Device time of each program alone, on strata's client (bench/progtime.py).
    b.log("overhead: per-program device time (progtime.py)")
    pt = b.tmp("progtime.json")
    cmd = [b.python, os.path.join(HERE, "progtime.py"), pre.config, *pre.overrides, "--out", pt,
           "--strata", b.strata, "--reps", "5"]
    if b.plugin:
        cmd += ["--plugin", b.plugin, "--cpu-devices", "2"]
    pr = run_proc(cmd, b.env, 600)
    if pr.rc == 0:
        with open(pt, encoding="utf-8") as f:
            out["programs"] = json.load(f)
    else:
        out["programs_error"] = pr.stderr_tail
    return out


def _split_busiest(data: str, t0: float, t1: float) -> dict[str, Any]:
    r = subprocess.run(["perf", "script", "-i", data, "-F", "pid,tid,time,ip,sym,dso"], capture_output=True,
                       text=True, timeout=600)
    rows = perfsplit.parse_script(r.stdout)
    counts: dict[int, int] = {}
    for pid, _tid, ts, _s, _d in rows:
        if t0 <= ts <= t1:
            counts[pid] = counts.get(pid, 0) + 1
    if not counts:
        raise RuntimeError(f"perf recorded no samples in the window ({data})")
    pid = max(counts, key=lambda k: counts[k])
    res = perfsplit.split(rows, pid, t0, t1)
    os.remove(data)  # tens of MB each
    return res


def _overhead_summary(sp: dict[str, Any], n_steps: int, step_s: float | None, ncpu: int) -> dict[str, Any]:
    main_per_step = sp["main_cpu_s"] / max(n_steps, 1)
    kernel = sp["worker_by_object_s"].get("kernel", 0.0)
    return {
        "split": sp, "steps_in_window": n_steps, "median_step_s": step_s,
        "main_thread_cpu_per_step_s": main_per_step,
        "main_thread_fraction": ratio(main_per_step, step_s),
        "worker_utilisation": sp["worker_cpu_s"] / (sp["window_s"] * ncpu),
        "worker_kernel_fraction": ratio(kernel, sp["worker_cpu_s"]),
    }


# --- remat: auto against none and full, and against the previous commit -----------

def remat_budget_between(none_peak: int, full_peak: int) -> int:
    """A sched.memory_budget that none's plan exceeds and full's fits: one
    byte below none's peak, so auto recomputes the fewest layers that help."""
    if full_peak >= none_peak:
        raise ValueError(f"full remat's peak {full_peak} B is not below none's {none_peak} B")
    return none_peak - 1


def remat_ratios(res: dict[str, Any]) -> None:
    """Fills res["ratio"] in place: each variant's best median step against
    none's and, for this commit's default and full, against the previous
    commit's same plan."""
    best = res["best"]

    def med(k: str) -> float | None:
        return (best.get(k) or {}).get("median_s")

    res["ratio"] = {
        "vs_none": {k: ratio(v.get("median_s"), med("none")) for k, v in best.items() if k != "none"},
        "default_vs_previous_default": ratio(med("auto"), med("previous default")),
        "full_vs_previous_full": ratio(med("full"), med("previous full")),
    }


def plan_peak(b: Bench, strata: str, config: str, overrides: list[str], env: dict[str, str]) -> dict[str, Any]:
    pin = KERNELS_XLA if strata == b.strata else []  # the bundle the section's runs use (KERNELS_XLA)
    r = subprocess.run([strata, "plan", "--json", config, *pin, *overrides], cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"strata plan {' '.join(overrides)} failed: {r.stderr.strip()[-1500:]}")
    return json.loads(r.stdout)["step"]


def base_commit(rev: str | None) -> tuple[str, str]:
    """The commit to compare with: REV, else HEAD's parent (HEAD itself when
    the tree has uncommitted changes: then HEAD is the previous state)."""
    def git(*args: str) -> str:
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout.strip()
    if not rev:
        rev = "HEAD" if git("status", "--porcelain", "--untracked-files=no") else "HEAD^"
    return rev, git("rev-parse", rev)


def build_commit(b: Bench, sha: str) -> str:
    """strata at commit |sha|, built as `make build` builds it (git archive
    into the work folder, cmake without tests); returns the binary."""
    src = os.path.join(b.work, f"prev-{sha[:12]}")
    os.makedirs(src, exist_ok=True)
    arch = subprocess.run(f"git archive {sha} | tar -x -C '{src}'", shell=True, cwd=ROOT, capture_output=True, text=True)
    if arch.returncode != 0:
        raise RuntimeError(f"git archive {sha}: {arch.stderr.strip()}")
    for cmd in (["cmake", "-S", src, "-B", os.path.join(src, "build"), "-DSTRATA_TESTS=OFF"],
                ["cmake", "--build", os.path.join(src, "build"), "-j", str(os.cpu_count() or 2)]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{(r.stdout + r.stderr)[-1500:]}")
    return os.path.join(src, "build", "strata")


def section_remat(b: Bench) -> dict[str, Any]:
    rp = b.plan.remat
    if rp is None:
        raise RuntimeError("this plan has no remat preset")
    common = [*rp.overrides, "train.eval_every=0", "train.eval_batches=1"]
    b.log("remat: warming the bundle and executable caches")
    b.strata_train(rp.config, [*common, "train.steps=1", "sched.remat=full"], "remat-warm-full")
    b.strata_train(rp.config, [*common, "train.steps=1", "sched.remat=none"], "remat-warm-none")
    none_peak = plan_peak(b, b.strata, rp.config, [*common, "sched.remat=none"], b.env)["predicted_peak_bytes"]
    full_peak = plan_peak(b, b.strata, rp.config, [*common, "sched.remat=full"], b.env)["predicted_peak_bytes"]
    budget = remat_budget_between(none_peak, full_peak)
    # (name, binary, overrides, env)
    variants: list[tuple[str, str, list[str], dict[str, str]]] = [
        ("auto", b.strata, [], b.env),
        ("none", b.strata, ["sched.remat=none"], b.env),
        ("full", b.strata, ["sched.remat=full"], b.env),
        ("auto with a budget", b.strata, [f"sched.memory_budget={budget}"], b.env),
    ]
    out: dict[str, Any] = {"config": rp.config, "overrides": rp.overrides, "steps": rp.steps, "warmup": rp.warmup,
                           "rounds": rp.rounds, "none_peak_bytes": none_peak, "full_peak_bytes": full_peak,
                           "budget_bytes": budget, "previous": None, "choices": {}, "runs": {}, "best": {}}
    if rp.previous:
        try:
            rev, sha = base_commit(b.base_commit)
            b.log(f"remat: building the previous commit {rev} ({sha[:12]})")
            t0 = time.monotonic()
            prev = build_commit(b, sha)
            # Its exporter runs on this Python (the scratch tree has no .venv).
            penv = {**b.env, "STRATA_PYTHON": b.python, "STRATA_BIN": prev}
            out["previous"] = {"rev": rev, "commit": sha, "build_s": round(time.monotonic() - t0, 1)}
            b.log("remat: warming the previous commit's bundle")
            b.strata_train(rp.config, [*common, "train.steps=1"], "remat-warm-prev", env=penv, strata=prev)
            variants += [("previous default", prev, [], penv), ("previous full", prev, ["sched.remat=full"], penv)]
        except RuntimeError as e:
            b.log(f"remat: the previous commit is left out: {e}")
            out["previous_error"] = str(e)[-1500:]
    for rnd in range(rp.rounds):
        # Each round starts one variant later, so a change of the machine's
        # load mid-round does not always hit the same variants.
        k = rnd % len(variants)
        for name, binary, extra, env in variants[k:] + variants[:k]:
            b.log(f"remat: round {rnd + 1}/{rp.rounds}: {name}")
            r = b.strata_train(rp.config, [*common, *extra, f"train.steps={rp.steps}"],
                               "remat-" + name.replace(" ", "_"), env=env, strata=binary, window=(rp.warmup, rp.steps))
            s = strata_step_summary(r["metrics"], rp.warmup)
            steps = step_metrics(r["metrics"])
            s["recomputes"] = steps[-1].get("recomputes") if steps else None
            s.update({"round": rnd, "other_load": round(r["proc"].other_load, 3), "maxrss_bytes": r["proc"].maxrss_bytes})
            out["runs"].setdefault(name, []).append(s)
            plan = events_by_name(r["events"]).get("plan", {})
            out["choices"][name] = {"policy": plan.get("policy"), "remat": plan.get("remat")}
    for name, rs in out["runs"].items():
        ok = [r for r in rs if r.get("median_s") is not None]
        if ok:
            best = dict(min(ok, key=lambda r: r["median_s"]))
            best["all_medians_s"] = [r["median_s"] for r in ok]
            out["best"][name] = best
    remat_ratios(out)
    return out


def remat_markdown(rm: dict[str, Any]) -> list[str]:
    prev = rm.get("previous") or {}
    L = [f"### sched.remat on one device ({rm['config']} {' '.join(rm['overrides'])}, "
         f"{rm['steps'] - rm['warmup']}+{rm['warmup']} steps, best of {rm['rounds']} interleaved round(s))", "",
         f"Predicted peak: none {fmt_size(rm['none_peak_bytes'])}, full {fmt_size(rm['full_peak_bytes'])}; "
         f"\"auto with a budget\" has sched.memory_budget={rm['budget_bytes']} (one byte below none's peak)."
         + (f" Previous commit: {prev['rev']} = `{prev['commit'][:12]}` (built in {prev['build_s']} s)." if prev
            else " Previous commit: not measured" + (f" ({rm['previous_error'][-200:]})" if rm.get("previous_error")
                                                     else " (--no-previous).")), ""]
    rows = []
    vs_none = rm["ratio"]["vs_none"]
    for name, d in rm["best"].items():
        ch = (rm["choices"].get(name) or {})
        policy = ch.get("policy") or ""
        rows.append([name, fmt(d["median_s"] * 1e3, " ms"), ", ".join(fmt(m * 1e3, "") for m in d["all_medians_s"]),
                     "1" if name == "none" else fmt(vs_none.get(name)), fmt(d.get("recomputes")),
                     fmt_size(d.get("peak_live_bytes")), f"`{policy.split(' offload=')[0]}`" if policy else "–",
                     ", ".join(f"{r['other_load']:.2f}" for r in rm["runs"].get(name, []))])
    L += [md_table(["run", "step", "medians per round (ms)", "/ none", "recomputes / step", "peak live bytes",
                    "remat chosen", "other load"], rows), ""]
    r = rm["ratio"]
    L += [f"This commit against the previous one: default plan {fmt(r.get('default_vs_previous_default'))}×, "
          f"full remat {fmt(r.get('full_vs_previous_full'))}× (step time ratios; below 1 is faster).", ""]
    return L


# --- parallel ---------------------------------------------------------------------

MESH_AXES = ("data", "fsdp", "tensor")


def parse_mesh(text: str) -> dict[str, int]:
    """A mesh string of the parallel section ("1", "data=2", "data=2,tensor=2")
    as every axis's size; axes not named are 1. Raises ValueError on anything else."""
    mesh = dict.fromkeys(MESH_AXES, 1)
    if text.strip() == "1":
        return mesh
    seen: set[str] = set()
    for part in text.split(","):
        axis, eq, n = part.strip().partition("=")
        if not eq or axis not in MESH_AXES or not n.isdigit() or int(n) < 1:
            raise ValueError(f"mesh {text!r}: want \"1\" or axis=N[,axis=N] with axes {', '.join(MESH_AXES)}")
        if axis in seen:
            raise ValueError(f"mesh {text!r}: axis {axis} given twice")
        seen.add(axis)
        mesh[axis] = int(n)
    return mesh


def mesh_name(mesh: dict[str, int]) -> str:
    """The canonical string of a mesh (axes in order, size-1 axes left out; "1": one device)."""
    return ",".join(f"{a}={mesh[a]}" for a in MESH_AXES if mesh.get(a, 1) > 1) or "1"


def mesh_devices(mesh: dict[str, int]) -> int:
    return mesh["data"] * mesh["fsdp"] * mesh["tensor"]


def mesh_overrides(mesh: dict[str, int]) -> list[str]:
    """strata's overrides for a mesh: every axis, so a config file's own parallel.* cannot leak in."""
    return [f"parallel.{a}={mesh[a]}" for a in MESH_AXES]


def parallel_policies(mesh: dict[str, int]) -> dict[str, list[str]]:
    """The strata runs of one mesh. default: gradients reduced per layer,
    deferred waits, the default gather prefetch and resharding. Where strata
    issues collectives (data or fsdp above 1) also sched.wait=eager, the
    overlap baseline; with data > 1 the bucketed gradient all-reduce
    (grad_reduce placement matters only for the data axis: an fsdp axis
    reduce-scatters each layer's gradients anyway); with fsdp > 1 no
    all-gather prefetch, and no resharding after the forward. A tensor-only
    mesh has no strata collectives (its all-reduces are inside the
    tensor-parallel programs, docs/parallelism.md): the default alone."""
    pol = {"default": ["sched.grad_reduce=per_layer", "sched.wait=deferred"]}
    if mesh["data"] > 1:
        pol["bucketed"] = ["sched.grad_reduce=bucketed"]
    if mesh["fsdp"] > 1:
        pol["gather_prefetch=0"] = ["sched.gather_prefetch=0"]
        pol["reshard_after_forward=false"] = ["sched.reshard_after_forward=false"]
    if mesh["data"] > 1 or mesh["fsdp"] > 1:
        pol["wait=eager"] = ["sched.grad_reduce=per_layer", "sched.wait=eager"]
    return pol


def comm_summary(metrics: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Medians of the communication fields of the post-warm-up steps; None
    where the build or the mesh has none (one device: no collectives)."""
    steps = step_metrics(metrics)[warmup:]

    def med(key: str) -> float | None:
        xs = [m.get(key) for m in steps]
        xs = [x for x in xs if isinstance(x, (int, float))]
        return median(xs) if xs else None

    return {"collectives": med("collectives"), "collective_bytes": med("collective_bytes"),
            "collective_s": med("collective_s"), "comm_overlap_ratio": med("comm_overlap_ratio"),
            "devices": med("devices")}


def parallel_ratios(res: dict[str, Any]) -> None:
    """Fills each mesh's ratios in place: against the 1-device strata step
    (default policy) and against the anchor jitted over the same mesh."""
    one = (res["meshes"].get("1") or {}).get("strata", {}).get("default") or {}
    for row in res["meshes"].values():
        st = row["strata"].get("default") or {}
        an = row.get("anchor") or {}
        row["ratio"] = {
            "step_vs_one_device": ratio(st.get("median_s"), one.get("median_s")),
            "peak_vs_one_device": ratio(st.get("peak_live_bytes"), one.get("peak_live_bytes")),
            "step_vs_anchor": ratio(st.get("median_s"), an.get("median_s")),
            "peak_vs_anchor": ratio(st.get("peak_live_bytes"), an.get("xla_peak_bytes_estimate")),
        }


def section_parallel(b: Bench) -> dict[str, Any]:
    pp = b.plan.parallel
    if pp is None:
        raise RuntimeError("this plan has no parallel preset")
    meshes = {mesh_name(m): m for m in map(parse_mesh, pp.meshes)}  # keyed by the canonical string
    dev = [f"runtime.cpu_devices={pp.cpu_devices}"] if pp.cpu_devices > 0 else []
    common = [*pp.overrides, *pp.strata_overrides, *dev, "train.eval_every=0", "train.eval_batches=1"]
    out: dict[str, Any] = {"config": pp.config, "overrides": pp.overrides, "steps": pp.steps, "warmup": pp.warmup,
                           "rounds": pp.rounds, "cpu_devices": pp.cpu_devices, "meshes": {}}

    def tag(name: str) -> str:  # a run folder's name
        return name.replace(",", "_").replace("=", "").replace(" ", "_")

    for name, m in meshes.items():
        # Each mesh has its own bundle (per-device microbatch, collectives, shard programs):
        # export it outside the timed runs.
        b.log(f"parallel: {name}: warming the bundle and executable caches")
        b.strata_train(pp.config, [*common, *mesh_overrides(m), "train.steps=1"], f"par-warm-{tag(name)}")
        out["meshes"][name] = {**m, "devices": mesh_devices(m), "strata": {}, "anchor": None, "runs": {}}
    for rnd in range(pp.rounds):
        for name, m in meshes.items():
            row = out["meshes"][name]
            for pol, extra in parallel_policies(m).items():
                b.log(f"parallel: round {rnd + 1}/{pp.rounds}: strata {name} {pol}")
                r = b.strata_train(pp.config, [*common, *mesh_overrides(m), *extra, f"train.steps={pp.steps}"],
                                   f"par-{tag(name)}-{tag(pol)}", window=(pp.warmup, pp.steps))
                s = strata_step_summary(r["metrics"], pp.warmup)
                s.update(comm_summary(r["metrics"], pp.warmup))
                s.update({"round": rnd, "other_load": round(r["proc"].other_load, 3),
                          "maxrss_bytes": r["proc"].maxrss_bytes})
                row["runs"].setdefault(f"strata {pol}", []).append(s)
            many = mesh_devices(m) > 1
            b.log(f"parallel: round {rnd + 1}/{pp.rounds}: anchor unroll " + (f"--mesh {name}" if many else "(1 device)"))
            a = b.anchor(pp.config, [*pp.overrides, "train.eval_every=0", "train.eval_batches=1"], "unroll",
                         f"par-anchor-{tag(name)}", pp.steps, mesh=name if many else None)
            x = a["result"]
            t = x["step_time_s"][pp.warmup:]
            row["runs"].setdefault("anchor", []).append(
                {"median_s": median(t), "n": len(t), "round": rnd, "mesh": x.get("mesh"),
                 "xla_peak_bytes_estimate": (x.get("memory") or {}).get("peak_bytes_estimate"),
                 "other_load": round(a["proc"].other_load, 3), "maxrss_bytes": a["proc"].maxrss_bytes})
    # Fastest run of each variant, as in the step section: other processes only slow a run down.
    for row in out["meshes"].values():
        for name, rs in row["runs"].items():
            ok = [r for r in rs if r.get("median_s") is not None]
            if not ok:
                continue
            best = dict(min(ok, key=lambda r: r["median_s"]))
            best["all_medians_s"] = [r["median_s"] for r in ok]
            if name == "anchor":
                row["anchor"] = best
            else:
                row["strata"][name[len("strata "):]] = best
    parallel_ratios(out)
    return out


# --- pipeline: stages and schedules against one device and fsdp -------------------

# Memory categories in `strata plan --explain`'s order (the metrics' keys).
MEM_CATEGORIES = ("params", "grads", "optimizer", "activations", "transfer", "gathered", "unreduced")
PIPELINE_FIELDS = ("sends", "send_bytes", "send_s", "send_overlap_ratio", "span_s", "bubble", "bubble_predicted",
                   "bubble_theory")


def pipeline_variants(pp: PipelinePreset) -> list[dict[str, Any]]:
    """The section's runs in report order: one device, then for each stage
    count its pipelines (one per schedule) and fsdp over as many devices.
    Every variant pins every parallel and pipeline key, so a config file's
    own cannot leak in."""
    def pin(pipeline: int = 1, schedule: str = "1f1b", virtual: int = 1, fsdp: int = 1) -> list[str]:
        return [f"parallel.pipeline={pipeline}", "parallel.data=1", f"parallel.fsdp={fsdp}", "parallel.tensor=1",
                f"sched.pipeline_schedule={schedule}", f"sched.pipeline_virtual={virtual}"]

    out = [{"name": "1 device", "kind": "one", "devices": 1, "stages": 1, "schedule": None, "virtual": 1,
            "overrides": pin()}]
    for p in pp.stages:
        for sch in pp.schedules:
            v = pp.virtual if sch == "interleaved" else 1
            out.append({"name": f"pipeline={p} {sch}" + (f" V={v}" if v > 1 else ""), "kind": "pipeline",
                        "devices": p, "stages": p, "schedule": sch, "virtual": v, "overrides": pin(p, sch, v)})
        out.append({"name": f"fsdp={p}", "kind": "fsdp", "devices": p, "stages": 1, "schedule": None, "virtual": 1,
                    "overrides": pin(fsdp=p)})
    return out


def pipeline_summary(metrics: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """The metrics' `pipeline` object over the measured steps: medians of
    its scalars and of each stage's busy time; each stage's peak of each
    category (and the plan's prediction of it) is the largest over every
    step line, warm-up included, as peak_live_bytes is. Also the category
    split at the device peak (peak_live_by_category), which a run without a
    pipeline has too. Fields a build does not report are None."""
    every = step_metrics(metrics)
    steps = every[warmup:]
    pipes = [m["pipeline"] for m in steps if isinstance(m.get("pipeline"), dict)]

    def med(xs: list[Any]) -> float | None:
        xs = [x for x in xs if isinstance(x, (int, float))]
        return median(xs) if xs else None

    def stage_of(m: dict[str, Any], s: int) -> dict[str, Any]:
        st = (m.get("pipeline") or {}).get("stage") or []
        return st[s] if s < len(st) and isinstance(st[s], dict) else {}

    def peaks(key: str, s: int) -> dict[str, int] | None:
        cats = [c for c in (stage_of(m, s).get(key) for m in every) if isinstance(c, dict)]
        if not cats:
            return None
        return {k: max(int(c.get(k) or 0) for c in cats) for k in sorted({k for c in cats for k in c})}

    out: dict[str, Any] = {k: med([p.get(k) for p in pipes]) for k in PIPELINE_FIELDS}
    n = max((len(p.get("stage") or []) for p in pipes), default=0)
    out["stage"] = []
    for s in range(n):
        got, want = peaks("peak_by_category", s), peaks("peak_by_category_predicted", s)
        out["stage"].append({"busy_s": med([stage_of(m, s).get("busy_s") for m in steps]),
                             "peak_by_category": got, "peak_by_category_predicted": want,
                             "matches_prediction": got == want if got is not None and want is not None else None})
    # the category split at the device peak: the step line with the largest peak_live_bytes
    at = [m for m in every if isinstance(m.get("peak_live_bytes"), (int, float))
          and isinstance(m.get("peak_live_by_category"), dict)]
    out["peak_live_by_category"] = max(at, key=lambda m: m["peak_live_bytes"])["peak_live_by_category"] if at else None
    return out


def pipeline_activations_peak(st: dict[str, Any]) -> int | None:
    """The largest activation bytes of one device: a pipeline's largest
    stage peak, otherwise the activations at the device peak."""
    pl = st.get("pipeline") or {}
    stages = [s["peak_by_category"].get("activations") for s in pl.get("stage") or [] if s.get("peak_by_category")]
    stages = [x for x in stages if isinstance(x, (int, float))]
    if stages:
        return int(max(stages))
    at = pl.get("peak_live_by_category") or {}
    x = at.get("activations")
    return int(x) if isinstance(x, (int, float)) else None


def pipeline_ratios(res: dict[str, Any]) -> None:
    """Fills each variant's ratios in place: step time and per-device peak
    against one device and against fsdp over the same number of devices."""
    vs = res["variants"]
    one = (vs.get("1 device") or {}).get("best") or {}
    for row in vs.values():
        st = row.get("best") or {}
        fs = next((r.get("best") or {} for r in vs.values() if r["kind"] == "fsdp" and r["devices"] == row["devices"]),
                  {})
        row["ratio"] = {
            "step_vs_one_device": ratio(st.get("median_s"), one.get("median_s")),
            "step_vs_fsdp": ratio(st.get("median_s"), fs.get("median_s")),
            "peak_vs_one_device": ratio(st.get("peak_live_bytes"), one.get("peak_live_bytes")),
            "peak_vs_fsdp": ratio(st.get("peak_live_bytes"), fs.get("peak_live_bytes")),
        }


def section_pipeline(b: Bench) -> dict[str, Any]:
    pp = b.plan.pipeline
    if pp is None:
        raise RuntimeError("this plan has no pipeline preset")
    vs = pipeline_variants(pp)
    common = [*pp.overrides, f"runtime.cpu_devices={pp.cpu_devices}", "train.eval_every=0", "train.eval_batches=1"]
    out: dict[str, Any] = {"config": pp.config, "overrides": pp.overrides, "steps": pp.steps, "warmup": pp.warmup,
                           "rounds": pp.rounds, "cpu_devices": pp.cpu_devices, "cpus": os.cpu_count(),
                           "variants": {}}

    def tag(name: str) -> str:  # a run folder's name
        return name.replace(" ", "_").replace("=", "")

    for v in vs:
        # each variant has its own bundle and executables (stage programs, shard programs)
        b.log(f"pipeline: {v['name']}: warming the bundle and executable caches")
        b.strata_train(pp.config, [*common, *v["overrides"], "train.steps=1"], f"pipe-warm-{tag(v['name'])}")
        out["variants"][v["name"]] = {**{k: v[k] for k in ("kind", "devices", "stages", "schedule", "virtual",
                                                           "overrides")}, "best": None, "runs": []}
    for rnd in range(pp.rounds):
        for v in vs:
            b.log(f"pipeline: round {rnd + 1}/{pp.rounds}: {v['name']}")
            r = b.strata_train(pp.config, [*common, *v["overrides"], f"train.steps={pp.steps}"],
                               f"pipe-{tag(v['name'])}", window=(pp.warmup, pp.steps))
            s = strata_step_summary(r["metrics"], pp.warmup)
            s.update(comm_summary(r["metrics"], pp.warmup))
            s["pipeline"] = pipeline_summary(r["metrics"], pp.warmup)
            s.update({"round": rnd, "other_load": round(r["proc"].other_load, 3),
                      "maxrss_bytes": r["proc"].maxrss_bytes})
            out["variants"][v["name"]]["runs"].append(s)
    # fastest run of each variant, as in the step and parallel sections
    for row in out["variants"].values():
        ok = [r for r in row["runs"] if r.get("median_s") is not None]
        if ok:
            row["best"] = {**min(ok, key=lambda r: r["median_s"]), "all_medians_s": [r["median_s"] for r in ok]}
    pipeline_ratios(out)
    return out


# --- packing: data.packing concat, none and pack on one corpus ------------------------

def packing_summary(metrics: list[dict[str, Any]], warmup: int, mode: str) -> dict[str, Any]:
    """One run's figures over the measured steps: the step summary, tokens
    per step and per second, the targets that count (metrics loss_weight,
    their mean; concat reports none because every target weighs 1) per step
    and per second, and the batch fill (data_s) in seconds and as a share of
    each step. Fields a build does not report are None."""
    s = strata_step_summary(metrics, warmup)
    steps = step_metrics(metrics)[warmup:]

    def nums(key: str) -> list[float]:
        return [m[key] for m in steps if isinstance(m.get(key), (int, float))]

    tokens = nums("tokens")
    tok = median(tokens)
    weights = tokens if mode == "concat" else nums("loss_weight")
    weight = statistics.fmean(weights) if weights else None
    fill = [m["data_s"] / m["step_time_s"] for m in steps
            if isinstance(m.get("data_s"), (int, float)) and m["step_time_s"] > 0]
    s.update({"tokens_per_step": tok, "tokens_per_s": ratio(tok, s["median_s"]),
              "loss_weight_per_step": weight, "weight_fraction": ratio(weight, tok),
              "effective_tokens_per_s": ratio(weight, s["median_s"]),
              "data_s_median": median(nums("data_s")), "data_fraction": median(fill),
              "data_fraction_max": max(fill) if fill else None})
    return s


def packing_ratios(res: dict[str, Any]) -> None:
    """Fills each variant's ratios to concat in place, of the best runs and
    of each round's runs (same round: the same state of the machine)."""
    vs = res["variants"]
    base = vs.get("concat") or {}
    c = base.get("best") or {}
    for row in vs.values():
        st = row.get("best") or {}
        by_round = {r["round"]: r for r in base.get("runs") or []}
        row["ratio"] = {
            "step_vs_concat": ratio(st.get("median_s"), c.get("median_s")),
            "tokens_per_s_vs_concat": ratio(st.get("tokens_per_s"), c.get("tokens_per_s")),
            "effective_vs_concat": ratio(st.get("effective_tokens_per_s"), c.get("effective_tokens_per_s")),
            "cpu_vs_concat": ratio(st.get("cpu_s_per_step"), c.get("cpu_s_per_step")),
            "effective_vs_concat_per_round": [
                ratio(r.get("effective_tokens_per_s"), by_round.get(r["round"], {}).get("effective_tokens_per_s"))
                for r in row.get("runs") or []],
        }


def section_packing(b: Bench) -> dict[str, Any]:
    pk = b.plan.packing
    if pk is None:
        raise RuntimeError("this plan has no packing preset")
    common = [*PACKING_KERNELS, *pk.overrides, "train.eval_every=0", "train.eval_batches=1"]
    out: dict[str, Any] = {"config": pk.config, "overrides": pk.overrides, "kernels": PACKING_KERNELS,
                           "steps": pk.steps, "warmup": pk.warmup, "rounds": pk.rounds, "variants": {}}
    for mode in pk.modes:
        # each mode has its own bundle (pack and none feed positions) and token file (documents)
        b.log(f"packing: {mode}: warming the bundle, executable and token caches")
        b.strata_train(pk.config, [*common, f"data.packing={mode}", "train.steps=1"], f"pack-warm-{mode}",
                       kernels_xla=False)
        out["variants"][mode] = {"overrides": [f"data.packing={mode}"], "best": None, "runs": []}
    for rnd in range(pk.rounds):
        for mode in pk.modes:
            b.log(f"packing: round {rnd + 1}/{pk.rounds}: data.packing={mode}")
            r = b.strata_train(pk.config, [*common, f"data.packing={mode}", f"train.steps={pk.steps}"],
                               f"pack-{mode}", window=(pk.warmup, pk.steps), kernels_xla=False)
            s = packing_summary(r["metrics"], pk.warmup, mode)
            s.update(r["proc"].extra)  # CPU seconds per step: steadier than wall time on a shared machine
            s.update({"round": rnd, "other_load": round(r["proc"].other_load, 3),
                      "maxrss_bytes": r["proc"].maxrss_bytes})
            out["variants"][mode]["runs"].append(s)
    # fastest run of each variant, as in the other sections: other processes only slow a run down
    for row in out["variants"].values():
        ok = [r for r in row["runs"] if r.get("median_s") is not None]
        if ok:
            row["best"] = {**min(ok, key=lambda r: r["median_s"]), "all_medians_s": [r["median_s"] for r in ok]}
    packing_ratios(out)
    return out


def packing_markdown(pk: dict[str, Any]) -> list[str]:
    setup = ", ".join(x for x in (f"{pk['config']} {' '.join(pk['overrides'])}".strip(),
                                  " ".join(pk.get("kernels") or []) or "default kernels") if x)
    L = [f"### Packing: data.packing on one corpus ({setup}, {pk['steps'] - pk['warmup']}+{pk['warmup']} steps, "
         f"best of {pk['rounds']} interleaved round(s))", ""]

    def pct(x: Any) -> str:
        return fmt(x * 100 if x is not None else None, " %")

    rows = []
    for mode, row in pk["variants"].items():
        st = row.get("best") or {}
        r = row.get("ratio") or {}
        rows.append([mode, fmt(st["median_s"] * 1e3 if st.get("median_s") else None, " ms"),
                     fmt(st.get("tokens_per_s"), "", 4), f"{fmt(st.get('loss_weight_per_step'), '', 4)} "
                     f"({pct(st.get('weight_fraction'))})", fmt(st.get("effective_tokens_per_s"), "", 4),
                     fmt(r.get("step_vs_concat")), fmt(r.get("tokens_per_s_vs_concat")),
                     fmt(r.get("effective_vs_concat")),
                     ", ".join(fmt(x) for x in r.get("effective_vs_concat_per_round") or []),
                     fmt(st.get("cpu_s_per_step")), fmt(r.get("cpu_vs_concat")),
                     fmt(st["data_s_median"] * 1e6 if st.get("data_s_median") is not None else None, " µs"),
                     f"{pct(st.get('data_fraction'))}, {pct(st.get('data_fraction_max'))}",
                     ", ".join(f"{x['other_load']:.2f}" for x in row["runs"])])
    L += [md_table(["data.packing", "step¹", "tokens/s²", "targets / step³", "effective tokens/s⁴",
                    "step / concat", "tokens/s / concat", "effective / concat", "per round", "CPU s / step⁵",
                    "CPU / concat", "batch fill⁶", "fill / step (median, max)⁶", "other load⁷"], rows), "",
          "¹ median step time after warm-up, the fastest round's; every variant trains the same number of "
          "sequences of the same length, on the same model and kernels.  ",
          "² tokens per step (batch × sequence, padding included) over the step.  ",
          "³ the targets that count, mean over the measured steps (metrics `loss_weight`: padding weighs 0; "
          "concat has no padding, every target counts), and their share of the tokens.  ",
          "⁴ the targets that count per second: targets / step over the step.  ",
          "⁵ strata's CPU time (all threads) per measured step, of the fastest round's run: far less "
          "sensitive than wall time to other processes on the machine.  ",
          "⁶ metrics `data_s`, the step's batch fill on the host (sampling, packing, segment ids, positions, "
          "weights), its median, and its share of each step (median and largest over the measured steps).  ",
          "⁷ CPUs kept busy by other processes during each run.", ""]
    return L


# --- multiprocess: 1 process x 2 devices against 2 processes x 1 device ------------

# Open MPI's consent to run as root (CI containers) and to put more ranks
# than cores on a host: this section's environment only, never the docs'.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mp_summary(metrics: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Medians over the measured steps of one run's metrics, one process or a
    job: the step time is the job's (its slowest rank's, step_time_s_max,
    when there are several), and every communication field the run has
    (None where it has none: one process has no xproc_*, one device per
    process no in-process collectives)."""
    steps = step_metrics(metrics)[warmup:]

    def med(key: str) -> float | None:
        xs = [m.get(key) for m in steps]
        xs = [x for x in xs if isinstance(x, (int, float))]
        return median(xs) if xs else None

    out = {k: med(k) for k in ("step_time_s", "step_time_s_min", "step_time_s_max", "processes", "xprocs", "xproc_bytes",
                               "xproc_s", "xproc_wait_s", "xproc_overlap_ratio", "collectives", "collective_bytes",
                               "collective_s", "comm_overlap_ratio")}
    out["median_s"] = out["step_time_s_max"] if out["step_time_s_max"] is not None else out["step_time_s"]
    slow = [m.get("slowest_rank") for m in steps if isinstance(m.get("slowest_rank"), int)]
    out["slowest_rank_counts"] = {str(r): slow.count(r) for r in sorted(set(slow))}
    out["n"] = len(steps)
    return out


def mp_ratios(row: dict[str, Any]) -> dict[str, Any]:
    """One mesh's comparison: the job's step time over one process's, and
    the overlap each reports (in one process the in-process collectives';
    across processes the XPROC ops')."""
    one, job = row.get("one_process") or {}, row.get("processes") or {}
    return {"step_time": ratio(job.get("median_s"), one.get("median_s")),
            "overlap_one_process": one.get("comm_overlap_ratio"),
            "overlap_across_processes": job.get("xproc_overlap_ratio")}


def fit_alpha_beta(points: list[dict[str, Any]], key: str = "median_s") -> dict[str, Any]:
    """Fits t = A + B * bytes to an all-reduce sweep (mpi_coll_bench's lines,
    2 ranks) by least squares on relative errors (weights 1/t^2, so the
    microsecond latencies count as much as the 64 MiB transfers). With the
    engine's algorithm (alltoall, then all-gather: 2(P-1) messages and
    2(P-1)/P of the bytes per rank) an all-reduce over P ranks takes
    2(P-1) alpha + 2(P-1)/P n beta, which at P=2 is 2 alpha + n beta:
    alpha = A/2, beta = B. key: which time of each size ("min_s": the
    least-disturbed iteration on a shared machine)."""
    pts = [(float(p["bytes"]), float(p[key])) for p in points if p.get(key)]
    if len(pts) < 2:
        raise ValueError(f"need two sizes or more to fit, got {len(pts)}")
    w = [1.0 / (t * t) for _, t in pts]
    sw = sum(w)
    sx = sum(wi * n for wi, (n, _) in zip(w, pts))
    sy = sum(wi * t for wi, (_, t) in zip(w, pts))
    sxx = sum(wi * n * n for wi, (n, _) in zip(w, pts))
    sxy = sum(wi * n * t for wi, (n, t) in zip(w, pts))
    det = sw * sxx - sx * sx
    if det <= 0:
        raise ValueError("all sizes equal: nothing to fit")
    b = (sw * sxy - sx * sy) / det
    a = (sy - b * sx) / sw
    worst = max(abs(a + b * n - t) / t for n, t in pts)
    return {"A_s": a, "B_s_per_byte": b, "alpha_s": a / 2, "beta_s_per_byte": b,
            "bandwidth_GBps": (1 / b / 1e9) if b > 0 else None, "max_rel_residual": worst, "points": len(pts)}


def allreduce_model_s(alpha: float, beta: float, nbytes: float, procs: int, collectives: int = 1) -> float:
    """The engine's all-reduce of |nbytes| in |collectives| pieces over
    |procs| ranks, one after another (no two in flight at once: an upper
    bound): collectives * 2(P-1) alpha + 2(P-1)/P nbytes beta."""
    if procs <= 1:
        return 0.0
    return collectives * 2 * (procs - 1) * alpha + 2 * (procs - 1) / procs * nbytes * beta


# The scaling estimate's network (docs/multiprocess.md): a stated one, not measured.
PAPER_NETWORK = {"name": "100 Gb/s, 5 us", "alpha_s": 5e-6, "beta_s_per_byte": 8 / 100e9}
SCALE_HOSTS = (8, 64, 512)


def scaling_estimate(fit: dict[str, Any] | None, grad_bytes: int, collectives: int) -> list[dict[str, Any]]:
    """Per host count (one process per host, data across hosts): the model's
    all-reduce time per step for the gradients, on the stated network and
    on the fitted loopback figures, split into latency and bandwidth terms."""
    nets = [PAPER_NETWORK]
    if fit and fit.get("beta_s_per_byte", 0) > 0 and fit.get("alpha_s", 0) > 0:
        nets.append({"name": "loopback fit", "alpha_s": fit["alpha_s"], "beta_s_per_byte": fit["beta_s_per_byte"]})
    rows = []
    for net in nets:
        for h in SCALE_HOSTS:
            lat = allreduce_model_s(net["alpha_s"], 0.0, grad_bytes, h, collectives)
            bw = allreduce_model_s(0.0, net["beta_s_per_byte"], grad_bytes, h, 0)
            rows.append({"network": net["name"], "hosts": h, "latency_s": lat, "bandwidth_s": bw, "total_s": lat + bw})
    return rows


def explain_xproc(b: Bench, config: str, overrides: list[str], procs: int) -> dict[str, Any]:
    """`strata plan --explain --json` of a job of |procs| processes: what
    crosses processes per step (cross_process_per_step), how many engine
    collectives that is, and the parameter bytes."""
    r = subprocess.run([b.strata, "plan", "--explain", "--json", config, *KERNELS_XLA, *overrides,
                        f"parallel.processes={procs}"], cwd=ROOT, env=b.env, capture_output=True, text=True)
    if r.returncode != 0:
        raise StrataFailed(f"strata plan --explain {' '.join(overrides)} failed: {r.stderr.strip()[-1500:]}", r.returncode)
    e = json.loads(r.stdout)["explain"]
    per = e["cross_process_per_step"]
    return {**per, "collectives_per_process": sum(c["collectives_per_process"] for c in e["cross_process"]),
            "span_axis": e["processes"]["span_axis"]}


def mpi_sweep(b: Bench, procs: int, max_bytes: int, env: dict[str, str]) -> list[dict[str, Any]]:
    """build/mpi_coll_bench over |procs| ranks: one line per size."""
    exe = os.path.join(os.path.dirname(b.strata), "mpi_coll_bench")
    if not os.access(exe, os.X_OK):
        raise RuntimeError(f"{exe} is missing (built with STRATA_MPI by `make build`)")
    # strata's runtime sets this malloc policy for itself (docs/runtime.md,
    # "Host allocator"); without it every large collective's receive buffer
    # is a fresh mmap, faulted in and zeroed (64 MiB: ~4x slower here).
    env = {**env, "GLIBC_TUNABLES": MALLOC_TUNABLES}
    r = subprocess.run([mpirun_path(), "--oversubscribe", "-np", str(procs), "-x", "GLIBC_TUNABLES", exe, str(max_bytes)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"mpi_coll_bench exited {r.returncode}: {r.stderr.strip()[-1500:]}")
    return [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


def mpirun_path() -> str:
    p = shutil.which("mpirun")
    if not p:
        raise RuntimeError("mpirun not found: `make setup` installs Debian's openmpi-bin")
    return p


def _mp_runs(b: Bench, mp: MultiprocPreset, common: list[str], env: dict[str, str], out: dict[str, Any]) -> None:
    """The timed runs of every mesh, interleaved per round; a mesh strata
    refuses across processes (exit 2) is recorded as not built, once."""
    launch = [mpirun_path(), "--oversubscribe", "-np", "2"]
    for name, row in out["meshes"].items():
        m = parse_mesh(name)
        b.log(f"multiprocess: {name}: warming the bundles (2 processes x 1 device, 1 process x 2 devices)")
        try:
            b.strata_train(mp.config, [*common, *mesh_overrides(m), "runtime.cpu_devices=1", "train.steps=1"],
                           f"mp-warm-job-{name.replace('=', '')}", env=env, launcher=launch)
        except StrataFailed as e:
            if e.rc != 2:
                raise
            # strata's own error line (every rank prints it; mpirun adds its banner)
            msg = next((ln.strip() for ln in str(e).splitlines() if ln.startswith("strata:")), str(e).splitlines()[-1])
            row["not_built"] = msg[-400:]
            b.log(f"multiprocess: {name} across processes: refused (exit 2), a 'not built' row")
        if not row.get("not_built") or mp.refused_alone:
            b.strata_train(mp.config, [*common, *mesh_overrides(m), "runtime.cpu_devices=2", "train.steps=1"],
                           f"mp-warm-one-{name.replace('=', '')}")
    for rnd in range(mp.rounds):
        for name, row in out["meshes"].items():
            m = parse_mesh(name)
            variants = []
            if not row.get("not_built") or mp.refused_alone:
                variants.append(("one_process", ["runtime.cpu_devices=2"], b.env, None))
            if not row.get("not_built"):
                variants.append(("processes", ["runtime.cpu_devices=1"], env, launch))
            k = rnd % len(variants) if variants else 0
            for key, dev, e, la in variants[k:] + variants[:k]:
                b.log(f"multiprocess: round {rnd + 1}/{mp.rounds}: {name} {key}")
                r = b.strata_train(mp.config, [*common, *mesh_overrides(m), *dev, f"train.steps={mp.steps}"],
                                   f"mp-{key}-{name.replace('=', '')}", env=e, launcher=la)
                s = mp_summary(r["metrics"], mp.warmup)
                s.update({"round": rnd, "other_load": round(r["proc"].other_load, 3)})
                row["runs"].setdefault(key, []).append(s)


def section_multiprocess(b: Bench) -> dict[str, Any]:
    mp = b.plan.multiproc
    if mp is None:
        raise RuntimeError("this plan has no multiprocess preset")
    env = {**b.env, **MPI_ENV}
    common = [*mp.overrides, "train.eval_every=0", "train.eval_batches=1"]
    out: dict[str, Any] = {"config": mp.config, "overrides": mp.overrides, "steps": mp.steps, "warmup": mp.warmup,
                           "rounds": mp.rounds, "cpus": os.cpu_count(),
                           "meshes": {mesh_name(parse_mesh(t)): {"runs": {}} for t in mp.meshes}}
    _mp_runs(b, mp, common, env, out)
    for name, row in out["meshes"].items():
        for key, rs in row["runs"].items():
            ok = [r for r in rs if r.get("median_s") is not None]
            if ok:
                row[key] = {**min(ok, key=lambda r: r["median_s"]), "all_medians_s": [r["median_s"] for r in ok]}
        row["ratio"] = mp_ratios(row)
        if not row.get("not_built"):
            row["explain"] = explain_xproc(b, mp.config, [*common, *mesh_overrides(parse_mesh(name)),
                                                         "runtime.cpu_devices=1"], 2)
    b.log(f"multiprocess: the dist engine's all-reduce, 4 B to {mp.sweep_max_bytes} B, 2 ranks")
    out["sweep"] = mpi_sweep(b, 2, mp.sweep_max_bytes, env)
    out["fit"] = fit_alpha_beta(out["sweep"])
    out["fit_least"] = fit_alpha_beta(out["sweep"], "min_s")
    sc, sov = mp.scale
    x = explain_xproc(b, sc, [*sov, "parallel.data=2", "runtime.cpu_devices=1"], 2)
    out["scale"] = {"config": sc, "overrides": sov, "grad_bytes": x["bytes_per_process"],
                    "collectives": x["collectives_per_process"],
                    "estimate": scaling_estimate(out["fit"], x["bytes_per_process"], x["collectives_per_process"])}
    return out


def multiprocess_markdown(mpr: dict[str, Any]) -> list[str]:
    L = [f"### Multi-process: 1 process x 2 devices against 2 processes x 1 device ({mpr['config']} "
         f"{' '.join(mpr['overrides'])}, {mpr['steps'] - mpr['warmup']}+{mpr['warmup']} steps, best of "
         f"{mpr['rounds']} interleaved round(s), the same {mpr.get('cpus')} cores)", ""]

    def ms(x: Any) -> str:
        return fmt(x * 1e3 if isinstance(x, (int, float)) else None, " ms")

    rows = []
    for name, row in mpr["meshes"].items():
        one, job, r = row.get("one_process") or {}, row.get("processes") or {}, row.get("ratio") or {}
        if row.get("not_built"):
            rows.append([name, ms(one.get("median_s")), "not built", "–", fmt(one.get("comm_overlap_ratio")), "–", "–",
                         "–", "–", "–"])
            continue
        ex = row.get("explain") or {}
        rows.append([name, ms(one.get("median_s")), ms(job.get("median_s")), fmt(r.get("step_time")),
                     fmt(one.get("comm_overlap_ratio")), fmt(job.get("xproc_overlap_ratio")),
                     fmt_size(job.get("xproc_bytes")), fmt_size(ex.get("wire_bytes_all_processes")),
                     ms(job.get("xproc_s")), ms(job.get("xproc_wait_s"))])
    L += [md_table(["mesh", "1 process x 2 devices step", "2 processes x 1 device step¹", "/ 1 process",
                    "overlap, 1 process²", "overlap, 2 processes³", "bytes across processes / step⁴",
                    "`plan --explain` says⁵", "MPI time / step⁶", "MPI wait / step⁷"], rows), ""]
    for name, row in mpr["meshes"].items():
        if row.get("not_built"):
            L.append(f"- {name} across processes: **not built** (strata train exits 2: {row['not_built']})")
    L += ["", "¹ the job's step: the slowest rank's (metrics `step_time_s_max`), median over the measured steps; "
          "Open MPI's default binding puts each rank on one core of its own.  ",
          "² `comm_overlap_ratio`: the share of the in-process collectives' time a launch ran too.  ",
          "³ `xproc_overlap_ratio`: the same for the cross-process (MPI) ops, over all ranks.  ",
          "⁴ `xproc_bytes`: bytes every rank sent through MPI in the step, summed over ranks.  ",
          "⁵ `cross_process_per_step.wire_bytes_all_processes` of `strata plan --explain --json`.  ",
          "⁶ `xproc_s`: the slowest rank's time with some cross-process op in flight.  ",
          "⁷ `xproc_wait_s`: the longest host time a rank blocked on one (what the plan did not hide).", "",
          "The single-process default path against the previous commit: the remat section's \"previous default\" "
          "run (the previous commit built from `git archive` in a scratch folder, timed in the same interleaved "
          "rounds; target \"1-device default step / previous commit's\").", ""]
    fit = mpr.get("fit")
    if fit:
        L += [f"The dist engine's all-reduce on 2 ranks over loopback (build/mpi_coll_bench, {fit['points']} sizes "
              f"from 4 B): t = A + B·n fitted with relative weights: A = {fmt(fit['A_s'] * 1e6, ' µs')}, "
              f"B = {fmt(fit['B_s_per_byte'] * 1e9, ' ns/B')} ({fmt(fit['bandwidth_GBps'], ' GB/s')}); the model "
              f"2(P-1)α + 2(P-1)/P·n·β gives α = {fmt(fit['alpha_s'] * 1e6, ' µs')}, β = B; worst relative "
              f"residual {fmt(fit['max_rel_residual'])}."
              + (f" Fitted to each size's least time instead: α = {fmt(least['alpha_s'] * 1e6, ' µs')}, "
                 f"β = {fmt(least['beta_s_per_byte'] * 1e9, ' ns/B')} ({fmt(least['bandwidth_GBps'], ' GB/s')})."
                 if (least := mpr.get("fit_least")) else ""), ""]
        L += [md_table(["bytes", "median", "least", "sent per rank"],
                       [[p["bytes"], fmt(p["median_s"] * 1e6, " µs"), fmt(p["min_s"] * 1e6, " µs"), p["bytes_sent"]]
                        for p in mpr.get("sweep", [])]), ""]
    sc = mpr.get("scale")
    if sc:
        L += [f"Scaling estimate (a model on paper, not a measurement): data across H hosts, one process each, "
              f"{' '.join([sc['config'], *sc['overrides']])}'s gradients ({fmt_size(sc['grad_bytes'])} in "
              f"{sc['collectives']} engine all-reduces "
              "per step, one after another): collectives·2(H-1)α + 2(H-1)/H·bytes·β.", ""]
        L += [md_table(["network", "hosts", "latency term", "bandwidth term", "all-reduce / step"],
                       [[e["network"], e["hosts"], ms(e["latency_s"]), ms(e["bandwidth_s"]), ms(e["total_s"])]
                        for e in sc["estimate"]]), ""]
    return L


def section_extra(b: Bench) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in sorted(glob.glob(os.path.join(HERE, "bench_*.py"))):
        name = os.path.basename(path)
        b.log(f"extra: {name}")
        # The helpers' contract: run from the repository root, binary in
        # $STRATA (or --strata), Markdown on stdout, non-zero exit on failure.
        env = {**b.env, "STRATA": b.strata}
        t0 = time.monotonic()
        try:
            r = subprocess.run([b.python, path], cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=b.plan.extra_timeout_s)
            out[name] = {"rc": r.returncode, "seconds": round(time.monotonic() - t0, 1),
                         "markdown": r.stdout.strip(), "stderr_tail": r.stderr[-1500:] if r.returncode else ""}
        except subprocess.TimeoutExpired as e:
            so = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            out[name] = {"rc": None, "seconds": b.plan.extra_timeout_s, "markdown": so.strip(),
                         "stderr_tail": f"timed out after {b.plan.extra_timeout_s} s"}
    return out


# --- environment, targets, report ----------------------------------------------

def environment(b: Bench) -> dict[str, Any]:
    def sh(cmd: list[str]) -> str:
        try:
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=b.env)
            return r.stdout.strip() if r.returncode == 0 else ""
        except (OSError, subprocess.TimeoutExpired):
            return ""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    doctor = sh([b.strata, "doctor"])
    gflops = None
    for line in doctor.splitlines():
        if line.startswith("matmul:") and "GFLOP/s" in line:
            try:
                gflops = float(line.split(":")[2].split("GFLOP/s")[0]) if line.count(":") > 1 else None
            except ValueError:
                gflops = None
    jaxv = sh([b.python, "-c", "import jax, jaxlib; print(jax.__version__, jaxlib.__version__)"])
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
        "cpu": cpu, "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
        "git_commit": sh(["git", "rev-parse", "HEAD"]), "git_dirty": bool(sh(["git", "status", "--porcelain"])),
        "strata": b.strata, "plugin": b.plugin, "jax": jaxv, "doctor_matmul_gflops": gflops,
        "doctor": doctor,
    }


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    t: list[dict[str, Any]] = []
    for preset, pr in res.get("step", {}).get("presets", {}).items():
        t.append(target_line(f"step time strata/unroll ({preset})", pr["ratio"].get("unroll"), 1.10, "le"))
        t.append(target_line(f"step time strata/scan ({preset})", pr["ratio"].get("scan"), 1.10, "le"))
    depths = res.get("compile", {}).get("depths", {})
    if depths:
        ks = sorted(depths, key=int)
        lo, hi = depths[ks[0]], depths[ks[-1]]
        t.append(target_line(f"strata cold start {ks[-1]} vs {ks[0]} layers",
                             ratio(hi["strata_cold"]["startup_s"], lo["strata_cold"]["startup_s"]), 1.2, "le"))
        t.append(target_line(f"unroll lower+compile / strata cold start at {ks[-1]} layers",
                             ratio(hi["unroll"]["lower_plus_compile_s"], hi["strata_cold"]["startup_s"]), 5.0, "ge"))
        warm = max(depths[k]["strata_warm"]["startup_s"] or 0 for k in ks)
        t.append(target_line("strata warm start (slowest depth)", warm, 1.0, "le", " s"))
    rm = res.get("remat")
    if rm:
        r = rm.get("ratio") or {}
        t.append(target_line(f"step time sched.remat=auto (no budget) / none ({rm['config']})",
                             (r.get("vs_none") or {}).get("auto"), 1.05, "le"))
        t.append(target_line(f"1-device default step / previous commit's ({rm['config']})",
                             r.get("default_vs_previous_default"), 1.05, "le"))
        t.append(target_line(f"1-device full-remat step / previous commit's ({rm['config']})",
                             r.get("full_vs_previous_full"), 1.05, "le"))
    pk = res.get("packing")
    if pk:
        for mode, row in pk["variants"].items():
            t.append(target_line(f"batch fill / step, data.packing={mode} ({pk['config']})",
                                 (row.get("best") or {}).get("data_fraction"), 0.01, "le"))
    ov = res.get("overhead", {})
    hf = (ov.get("strata") or {}).get("main_thread_fraction")
    if hf is None:
        hf = (ov.get("metrics") or {}).get("host_fraction")
    if ov:
        t.append(target_line(f"framework overhead ({ov.get('preset')})", hf, 0.05, "le"))
    return t


def markdown(res: dict[str, Any]) -> str:
    env = res["environment"]
    L = [f"## {env['date']} on {env['host']} ({env['cpus']} CPUs: {env['cpu']})", "",
         f"commit `{env['git_commit'][:12]}`{' (dirty tree)' if env['git_dirty'] else ''}, jax {env['jax']}, "
         f"load average at start {', '.join(f'{x:.2f}' for x in env['loadavg_start'])}"
         + (f", `strata doctor` matmul {env['doctor_matmul_gflops']} GFLOP/s" if env.get("doctor_matmul_gflops") else "")
         + f"; bench took {res.get('seconds', 0):.0f} s" + (" (--quick)" if res.get("quick") else ""), ""]
    st = res.get("step")
    peak = env.get("doctor_matmul_gflops")
    if st:
        L += [f"### Step time (median after warm-up; best of {st['rounds']} interleaved rounds, diagnostics one round)",
              ""]
        rows = []
        for preset, pr in st["presets"].items():
            bst = pr["best"]
            for v, runs in pr["runs"].items():
                if v not in bst:
                    continue
                d = bst[v]
                per_round = pr["ratio_per_round"].get(v, [])
                diag = v in pr.get("diagnostic", [])
                n_steps = pr.get("diag_steps", pr["steps"]) if diag else pr["steps"]
                rows.append([f"{preset} ({n_steps - pr['warmup']}+{pr['warmup']})", f"*{v}*" if diag else v,
                             fmt(d["median_s"] * 1e3, " ms"),
                             ", ".join(fmt(m * 1e3, "") for m in d["all_medians_s"]),
                             "1" if v == "strata" else fmt(pr["ratio"].get(v)),
                             ", ".join(fmt(x) for x in per_round),
                             fmt(d.get("cpu_s_per_step")), "" if v == "strata" else fmt(pr["cpu_ratio"].get(v)),
                             fmt(d.get("minor_faults_per_step"), "", 2),
                             f"{pr['model_flops_per_step'] / d['median_s'] / 1e9:.1f}",
                             fmt(pr["tokens_per_step"] / d["median_s"], "", 4) if pr.get("tokens_per_step") else "–",
                             f"{pr['model_flops_per_step'] / d['median_s'] / 1e9 / peak:.1%}" if peak else "–",
                             fmt_bytes(d["maxrss_bytes"]),
                             fmt_bytes(runs[0].get("peak_live_bytes") if v.startswith("strata")
                                       else runs[0].get("xla_peak_bytes_estimate")),
                             ", ".join(f"{r['other_load']:.2f}" for r in runs)])
        L += [md_table(["preset (steps+warm-up)", "run", "step", "medians per round (ms)", "strata / this",
                        "per round", "CPU s / step", "strata / this (CPU)", "minor faults / step", "model GFLOP/s",
                        "tokens/s", "of matmul peak³", "peak RSS", "device bytes¹", "other load²"], rows), "",
              *[f"**{k} ({v}) failed:** {e[-300:]}  " for k, pr in st["presets"].items()
                for v, e in (pr.get("errors") or {}).items()],
              "*Italics*: diagnostic runs (one round), each isolating one cause of the difference.  ",
              "Re-runs of variants that never had the CPUs to themselves: "
              + ", ".join(f"{k} {v.get('retries', 0)}" for k, v in st["presets"].items()) + ".  ",
              "¹ strata: accounted peak live bytes (metrics `peak_live_bytes`); anchors: XLA's memory analysis "
              "of the compiled step (arguments + outputs − aliased + temporaries).  ",
              "² CPUs kept busy by other processes during each run (/proc/stat minus the run's own CPU time).  ",
              "³ model FLOP/s (bench/flops.py) over `strata doctor`'s measured matmul peak"
              + (f" ({peak:g} GFLOP/s)" if peak else " (not measured: –)") + ": the MFU of the run.", ""]
    co = res.get("compile")
    if co:
        L += [f"### Start-up and compile time against depth ({co['config']} {' '.join(co['overrides'])}, "
              "model.n_layers varied)", ""]
        rows = []
        for n, row in co["depths"].items():
            c, w, u, s = row["strata_cold"], row["strata_warm"], row["unroll"], row["scan"]
            nd = row.get("strata_new_depth") or {}
            new_depth = (f"{fmt(nd.get('startup_s'), ' s')} ({nd.get('programs_compiled')} compiled)"
                         if nd else "–")
            rows.append([n, fmt(c["startup_s"], " s"), fmt(c.get("before_compile_s"), " s"), fmt(c["compile_s"], " s"),
                         fmt(c.get("init_s"), " s"), fmt(w["startup_s"], " s"), new_depth,
                         f"{fmt(u['lower_s'], ' s')} + {fmt(u['compile_s'], ' s')}",
                         f"{fmt(s['lower_s'], ' s')} + {fmt(s['compile_s'], ' s')}",
                         fmt(ratio(u["lower_plus_compile_s"], c["startup_s"]), "×"),
                         f"{fmt(u.get('process_wall_s'), ' s')} ({fmt(ratio(u.get('process_wall_s'), c['startup_s']), '×')})"])
        L += [md_table(["layers", "strata cold start", "of which: until bundle ready³", "XLA compile⁴",
                        "init run⁵", "strata warm start", "strata after another depth⁷", "unroll lower + compile",
                        "scan lower + compile",
                        "unroll / strata cold", "unroll whole process⁶ (/ strata cold)"], rows), "",
              f"Fastest of {co.get('rounds', 1)} round(s) per figure, depth order alternating between rounds; "
              "every run's figure is in the JSON (`runs`).  ",
              "³ process start to the `bundle` event: config, data (token file cached), the exporter "
              "(a Python process: interpreter + jax import + lowering every program), runtime creation.  ",
              "⁴ the `compile` event: every program of the step, eval and init, one batch "
              "(per-program seconds in the JSON, `program_seconds`).  ",
              "⁵ `compile` → `run` events: running the init programs and zeroing the optimizer state.  ",
              "⁶ the anchor process from start to compiled: interpreter, `import jax`, parameter init, "
              "trace, lower, compile (and writing its JSON). Like strata's cold start, everything before "
              "the first step.  ",
              "⁷ the cache of the depth run just before (its bundle and executables): a depth sweep's next "
              "run. No program depends on the depth, so one bundle serves every depth and nothing should "
              "export or compile.", ""]
    ov = res.get("overhead")
    if ov:
        L += [f"### Framework overhead ({ov['preset']} preset, {ov['steps']} steps, {ov['warmup']} warm-up)", ""]
        m = ov.get("metrics") or {}
        L.append(f"- metrics: step time − time blocked in reads = {fmt((m.get('host_s_median') or 0) * 1e3, ' ms')} "
                 f"per step = {fmt((m.get('host_fraction') or 0) * 100, ' %')} of {fmt((m.get('median_s') or 0) * 1e3, ' ms')}"
                 if m.get("host_fraction") is not None else "- metrics: wait_s not reported by this build")
        if ov.get("perf_unavailable"):
            L.append(f"- perf: not measured ({ov['perf_unavailable']})")
        for k in ("strata", "unroll"):
            o = ov.get(k)
            if not o:
                continue
            sp = o["split"]
            objs = ", ".join(f"{n} {v * 1e3 / o['steps_in_window']:.2f}" for n, v in sp["main_by_object_s"].items())
            L.append(f"- perf, {k}: main thread {o['main_thread_cpu_per_step_s'] * 1e3:.2f} ms CPU per step "
                     f"= {fmt(o['main_thread_fraction'] * 100 if o['main_thread_fraction'] is not None else None, ' %')} "
                     f"of the step (ms/step by object: {objs}); worker threads busy "
                     f"{o['worker_utilisation'] * 100:.0f} % of the window on {res['environment']['cpus']} CPUs, "
                     f"{fmt((o['worker_kernel_fraction'] or 0) * 100, ' %')} of their CPU time in the kernel")
        pg = ov.get("programs")
        if pg:
            step = (ov.get("metrics") or {}).get("median_s")
            L += ["", f"Each program alone on {'strata' + chr(39) + 's plugin' if pg['client'] != 'jaxlib' else 'jaxlib'} "
                  f"(median of 5): {pg['launches_per_step']} launches, sum {fmt(pg['sum_per_step_s'] * 1e3, ' ms')} "
                  f"per step against strata's measured {fmt((step or 0) * 1e3, ' ms')}", ""]
            prow = [[q["program"], q["launches_per_step"], fmt(q["median_s"] * 1e3, " ms"),
                     fmt(q["per_step_s"] * 1e3, " ms"),
                     fmt(q["flops"] / q["median_s"] / 1e9 if q.get("flops") else None, ""),
                     fmt(q["compile_s"], " s")]
                    for q in sorted(pg["programs"], key=lambda q: -q["per_step_s"])]
            L += [md_table(["program", "launches / step", "time / launch", "time / step", "GFLOP/s (XLA count)",
                            "compile"], prow)]
        elif ov.get("programs_error"):
            L.append(f"- per-program times failed: {ov['programs_error'][-300:]}")
        L.append("")
    rm = res.get("remat")
    if rm:
        L += remat_markdown(rm)
    pa = res.get("parallel")
    if pa:
        L += parallel_markdown(pa)
    pl = res.get("pipeline")
    if pl:
        L += pipeline_markdown(pl)
    pk = res.get("packing")
    if pk:
        L += packing_markdown(pk)
    mpr = res.get("multiprocess")
    if mpr:
        L += multiprocess_markdown(mpr)
    tg = res.get("targets")
    if tg:
        L += ["### Targets (reported, not asserted)", ""]
        L += [md_table(["target", "measured", "limit", "met"],
                       [[t["target"], fmt(t["value"], t.get("unit", "")), fmt(t["limit"], t.get("unit", "")),
                         "–" if t["met"] is None else ("yes" if t["met"] else "**no**")] for t in tg]), ""]
    ex = res.get("extra")
    if ex:
        L += ["### Other benchmarks (bench/bench_*.py)", ""]
        for name, e in ex.items():
            L += [f"#### {name} (exit {e['rc']}, {e['seconds']} s)", "", e["markdown"] or "(no output)", ""]
            if e.get("stderr_tail"):
                L += ["```", e["stderr_tail"].strip(), "```", ""]
    return "\n".join(L) + "\n"


def parallel_markdown(pa: dict[str, Any]) -> list[str]:
    on = f"{pa['cpu_devices']} CPU devices" if pa.get("cpu_devices") else f"{pa.get('devices', '?')} devices"
    L = [f"### Parallel: meshes on {on} ({pa['config']} {' '.join(pa['overrides'])}, "
         f"{pa['steps'] - pa['warmup']}+{pa['warmup']} steps, best of {pa['rounds']} interleaved round(s))", ""]

    def ms(x: Any) -> str:
        return fmt(x * 1e3 if x is not None else None, " ms")

    rows = []
    for name, row in pa["meshes"].items():
        st = row["strata"].get("default") or {}
        an = row.get("anchor") or {}
        r = row.get("ratio") or {}
        rows.append(["1 device" if name == "1" else name, ms(st.get("median_s")), fmt(r.get("step_vs_one_device")),
                     ms(an.get("median_s")), fmt(r.get("step_vs_anchor")),
                     fmt_size(st.get("peak_live_bytes")), fmt(r.get("peak_vs_one_device")),
                     fmt_size(an.get("xla_peak_bytes_estimate")), fmt(r.get("peak_vs_anchor")),
                     ", ".join(f"{x['other_load']:.2f}" for rs in row["runs"].values() for x in rs)])
    L += [md_table(["mesh", "strata step¹", "/ 1-device strata", "anchor (same mesh) step", "strata / anchor",
                    "strata peak per device²", "/ 1-device strata", "anchor peak³", "strata / anchor",
                    "other load⁴"], rows), ""]
    rows = []
    for name, row in pa["meshes"].items():
        if name == "1":
            continue
        for pol, st in row["strata"].items():
            rows.append([name, pol, ms(st.get("median_s")), fmt(st.get("collectives")),
                         fmt_size(st.get("collective_bytes")), ms(st.get("collective_s")),
                         fmt(st.get("comm_overlap_ratio")), fmt_size(st.get("peak_live_bytes"))])
    if rows:
        L += [md_table(["mesh", "policy⁵", "step", "collectives / step", "bytes / step (per device)",
                        "collective time", "comm_overlap_ratio⁶", "peak per device"], rows), ""]
    L += ["¹ the default policy: sched.grad_reduce=per_layer, sched.wait=deferred, the default "
          "sched.gather_prefetch and sched.reshard_after_forward.  ",
          "² metrics `peak_live_bytes`: the executor's accounted live bytes, per device on a mesh.  ",
          "³ XLA's memory analysis of the jitted step (over a mesh: of the partitioned module, one device's).  ",
          "⁴ CPUs kept busy by other processes during each run, strata's runs then the anchor's.  ",
          "⁵ each the default with one change: sched.wait=eager, sched.grad_reduce=bucketed (data > 1), "
          "sched.gather_prefetch=0 or sched.reshard_after_forward=false (fsdp > 1).  ",
          "⁶ medians over the measured steps of the metrics fields; the part of the collectives' time during "
          "which a launch ran too (docs/parallelism.md). Collectives are the ones strata issues (data and fsdp); "
          "a tensor axis's all-reduces run inside its programs and are not counted.", ""]
    return L


def pipeline_markdown(pl: dict[str, Any]) -> list[str]:
    cpus = pl.get("cpus") or "?"
    L = [f"### Pipeline: stages and schedules on {pl['cpu_devices']} CPU devices, against one device and fsdp "
         f"({pl['config']} {' '.join(pl['overrides'])}, {pl['steps'] - pl['warmup']}+{pl['warmup']} steps, "
         f"best of {pl['rounds']} interleaved round(s))", ""]

    def ms(x: Any) -> str:
        return fmt(x * 1e3 if x is not None else None, " ms")

    rows = []
    for name, row in pl["variants"].items():
        st = row.get("best") or {}
        p = st.get("pipeline") or {}
        r = row.get("ratio") or {}
        if row["kind"] == "pipeline":
            moved = f"{fmt(p.get('sends'))} sends, {fmt_size(p.get('send_bytes'))}"
            overlap = p.get("send_overlap_ratio")
        elif row["kind"] == "fsdp":
            moved = f"{fmt(st.get('collectives'))} collectives, {fmt_size(st.get('collective_bytes'))}"
            overlap = st.get("comm_overlap_ratio")
        else:
            moved, overlap = "–", None
        rows.append([name, row["devices"], ms(st.get("median_s")), fmt(r.get("step_vs_one_device")),
                     fmt(r.get("step_vs_fsdp")), fmt_size(st.get("peak_live_bytes")),
                     fmt(r.get("peak_vs_one_device")), fmt(r.get("peak_vs_fsdp")),
                     fmt_size(pipeline_activations_peak(st)), fmt(p.get("bubble")), fmt(p.get("bubble_predicted")),
                     fmt(p.get("bubble_theory")), moved, fmt(overlap),
                     ", ".join(f"{x['other_load']:.2f}" for x in row["runs"])])
    L += [md_table(["variant", "devices", "step¹", "/ 1 device", "/ fsdp, same devices", "peak per device²",
                    "/ 1 device", "/ fsdp", "activations peak³", "bubble measured⁴", "predicted⁴", "theory⁴",
                    "transfers / step⁵", "overlap⁶", "other load⁷"], rows), ""]
    rows = []
    for name, row in pl["variants"].items():
        stages = ((row.get("best") or {}).get("pipeline") or {}).get("stage") or []
        for i, s in enumerate(stages):
            got = s.get("peak_by_category") or {}
            same = s.get("matches_prediction")
            rows.append([name, i, ms(s.get("busy_s")), fmt_size(got.get("activations")),
                         " / ".join(fmt_size(got.get(k)) for k in MEM_CATEGORIES),
                         "–" if same is None else ("yes" if same else "**no**")])
    if rows:
        L += [md_table(["variant", "stage", "busy⁸", "activations peak", "peak by category⁹ (" +
                        " / ".join(MEM_CATEGORIES) + ")", "= plan's prediction"], rows), ""]
    L += ["¹ median step time after warm-up, the fastest round's; every variant trains the same global batch in the "
          "same microbatches.  ",
          "² metrics `peak_live_bytes`: the executor's accounted live bytes of the fullest device (a pipeline: "
          "of its fullest stage; fsdp: every device holds as much).  ",
          "³ a pipeline: the largest stage's activation peak (`pipeline.stage[].peak_by_category`); one device "
          "and fsdp: the activations at the device peak (`peak_live_by_category`).  ",
          "⁴ measured: 1 − the stages' summed busy time / (P × the step's span) (metrics `pipeline.bubble`); "
          "predicted: the plan's simulation, one device per stage (`bubble_predicted`); theory for equal "
          "stages: (P−1)/(M+P−1), interleaved (P−1)/(V·M+P−1) (`bubble_theory`).  ",
          "⁵ a pipeline: SEND ops between stages and their bytes per step (all stages); fsdp: its all-gathers "
          "and reduce-scatters and their bytes per device.  ",
          "⁶ a pipeline: `send_overlap_ratio`; fsdp: `comm_overlap_ratio` (medians over the measured steps).  ",
          "⁷ CPUs kept busy by other processes during each run.  ",
          "⁸ the union of the stage's launches' start..complete, median over the measured steps.  ",
          "⁹ each category's own maximum on the stage's device over the run (the categories peak at different "
          "ops, so they do not add up to the peak); the last column compares them with the plan's "
          "`peak_by_category_predicted`.", "",
          f"What {cpus} CPU cores shared by {pl['cpu_devices']} CPU devices can and cannot show. The devices are "
          "threads of one process on the same cores, so every variant runs the same arithmetic on the same "
          "hardware: a step ratio below 1 means the stages' launches kept the cores busier than one device's "
          "small launches do, not that stages scale, and the ratios cannot grow with P beyond the cores. Stages do "
          "not wait for each other as real devices do: a stage with nothing ready leaves the cores to the others, "
          "and a stage's busy time counts launches slowed by sharing the cores, so the measured bubble reflects how "
          "the cores were shared, not the schedule's bubble. The predicted bubble is the plan's simulation of one "
          "device per stage and is the one to compare with the theory. Sends and fsdp's collectives are memory "
          "copies between devices of one process, so their overlap ratios show that the executor issues them "
          "without blocking, not how much link time they would hide. The per-stage peaks are exact: the "
          "executor's ledger, independent of the load and equal to the plan's prediction, and they carry over to "
          "real devices.", ""]
    return L


def save(res: dict[str, Any], md: str, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    stem = f"{datetime.date.today().isoformat()}-{platform.node() or 'host'}"
    path = os.path.join(out_dir, f"{stem}.json")
    k = 2
    while os.path.exists(path):
        path = os.path.join(out_dir, f"{stem}-{k}.json")
        k += 1
    tmp = path + f".tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)
    readme = os.path.join(out_dir, "README.md")
    if not os.path.exists(readme):
        with open(readme, "w", encoding="utf-8") as f:
            f.write("# Benchmark results\n\nOne section per `make bench` run, newest last; the JSON file named in "
                    "each section has every number. Method: docs/performance.md.\n\n")
    with open(readme, "a", encoding="utf-8") as f:
        f.write(md.replace("\n### ", f"\n(`{os.path.basename(path)}`)\n\n### ", 1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="test preset, few steps: checks the pipeline only")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    ap.add_argument("--rounds", type=int, help="interleaved rounds of the step-time runs")
    ap.add_argument("--steps", type=int, help="steps per step-time run (warm-up included)")
    ap.add_argument("--presets", help="step section: a comma-separated subset of its presets (full plan: "
                    "tiny, small, gpt2-124m)")
    ap.add_argument("--no-save", action="store_true", help="print the Markdown only")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--keep", action="store_true", help="keep the work folder (run dirs, JSON of every run)")
    ap.add_argument("--base-commit", help="remat section: the commit to compare with (default HEAD^, or HEAD when "
                    "the tree has uncommitted changes)")
    ap.add_argument("--no-previous", action="store_true", help="remat section: do not build and time the previous commit")
    args = ap.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; choose from {SECTIONS}")
    plan = QUICK if args.quick else FULL
    if args.presets:
        keep = [p.strip() for p in args.presets.split(",") if p.strip()]
        unknown = [p for p in keep if p not in plan.presets]
        if unknown:
            ap.error(f"unknown preset(s) {unknown}; the step section has {sorted(plan.presets)}")
        plan.presets = {k: v for k, v in plan.presets.items() if k in keep}
    if args.rounds:
        plan.rounds = args.rounds
    if args.steps:
        if args.steps <= plan.warmup:
            ap.error(f"--steps must exceed the {plan.warmup} warm-up steps")
        plan.steps = args.steps
    work = tempfile.mkdtemp(prefix="strata-bench-")
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[bench {time.monotonic() - t_start:6.0f}s] {msg}", file=sys.stderr, flush=True)

    b = Bench(plan, work, log)
    b.base_commit = args.base_commit
    if args.no_previous and plan.remat:
        plan.remat.previous = False
    if not os.access(b.strata, os.X_OK):
        print(f"bench: {b.strata} is missing: run `make build` (or set STRATA_BIN)", file=sys.stderr)
        return 2
    res: dict[str, Any] = {"schema": 1, "quick": args.quick, "environment": environment(b)}
    failed = []
    for sec in sections:
        fn = {"step": section_step, "compile": section_compile, "overhead": section_overhead,
              "remat": section_remat, "parallel": section_parallel, "pipeline": section_pipeline,
              "packing": section_packing, "multiprocess": section_multiprocess,
              "extra": section_extra}[sec]
        try:
            res[sec] = fn(b)
        except Exception as e:  # noqa: BLE001 - one broken section must not lose the others' numbers
            log(f"{sec}: FAILED: {e}")
            res[sec + "_error"] = str(e)
            failed.append(sec)
    res["seconds"] = time.monotonic() - t_start
    res["environment"]["loadavg_end"] = os.getloadavg()
    res["targets"] = targets(res)
    md = markdown(res)
    for sec in failed:
        md += f"\n**section {sec} failed:** {res[sec + '_error'][:1500]}\n"
    print(md)
    if not args.no_save:
        path = save(res, md, args.out_dir)
        log(f"results: {os.path.relpath(path, ROOT)} and {os.path.relpath(os.path.join(args.out_dir, 'README.md'), ROOT)}")
    if args.keep:
        log(f"work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
