"""Where a process's CPU time goes, per thread, from a `perf record` sample file.

Used by bench/run.py to measure framework overhead (docs/performance.md,
"Framework overhead"): the process is recorded with a software clock event
at a fixed period (`-e cpu-clock -c PERIOD_NS`, so every sample stands for
PERIOD_NS of CPU time on one thread) and a CLOCK_MONOTONIC time base, then
the samples inside the steady-state window of the training loop are split
into the *main thread* (the host side: strata's plan walk, launches, hooks,
metrics; or Python + jax dispatch for the anchors) and every other thread
(XLA's worker threads running the programs).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import tempfile
from typing import Any

PERIOD_NS = 1_000_000  # one sample = 1 ms of CPU time on one thread

# "  1234/1240  2025.816000:  7f76e12336e1 sym+0x10 (/path/lib.so)"; the
# symbol and the object are missing on some samples.
_LINE = re.compile(r"^\s*(\d+)/(\d+)\s+([0-9.]+):\s*(.*)$")


def available() -> str | None:
    """None when `perf record` works here, else the reason it does not."""
    if not shutil.which("perf"):
        return "perf is not installed"
    with tempfile.TemporaryDirectory() as d:
        try:
            r = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-c", str(PERIOD_NS), "-k",
                                "CLOCK_MONOTONIC", "-o", os.path.join(d, "p.data"), "--", "true"],
                               capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"perf record failed: {e}"
        if r.returncode != 0:
            return f"perf record failed: {r.stderr.strip()[:300]}"
    return None


def record_prefix(out: str) -> list[str]:
    return ["perf", "record", "-q", "-e", "cpu-clock", "-c", str(PERIOD_NS), "-k", "CLOCK_MONOTONIC",
            "-o", out, "--"]


def parse_script(text: str) -> list[tuple[int, int, float, str, str]]:
    """`perf script -F pid,tid,time,ip,sym,dso` output -> (pid, tid, time, symbol, object)."""
    rows = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        rest = m.group(4).strip()
        dso = ""
        if rest.endswith(")") and "(" in rest:
            i = rest.rindex("(")
            rest, dso = rest[:i].strip(), rest[i + 1:-1]
        # drop the leading instruction address
        parts = rest.split(None, 1)
        sym = parts[1] if len(parts) == 2 and re.fullmatch(r"[0-9a-f]+", parts[0]) else rest
        rows.append((int(m.group(1)), int(m.group(2)), float(m.group(3)), sym, dso))
    return rows


def _module(dso: str) -> str:
    base = os.path.basename(dso) or "?"
    if base == "[kernel.kallsyms]":
        return "kernel"
    return base


def split(rows: list[tuple[int, int, float, str, str]], pid: int, t0: float, t1: float,
          period_ns: int = PERIOD_NS) -> dict[str, Any]:
    """CPU seconds in [t0, t1] (CLOCK_MONOTONIC) of process `pid`: main thread
    (tid == pid) by object file and top symbols, and the other threads."""
    per = period_ns * 1e-9
    main_by_mod: collections.Counter[str] = collections.Counter()
    main_sym: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[int] = collections.Counter()
    worker_by_mod: collections.Counter[str] = collections.Counter()
    for p, tid, ts, sym, dso in rows:
        if p != pid or not t0 <= ts <= t1:
            continue
        threads[tid] += 1
        if tid != pid:
            worker_by_mod[_module(dso)] += 1
        else:
            mod = _module(dso)
            main_by_mod[mod] += 1
            main_sym[f"{sym or '?'} [{mod}]"] += 1
    wall = max(t1 - t0, 1e-9)
    workers = {str(t): round(n * per, 4) for t, n in threads.most_common() if t != pid}
    return {
        "window_s": round(wall, 4),
        "main_cpu_s": round(threads.get(pid, 0) * per, 4),
        "main_by_object_s": {k: round(v * per, 4) for k, v in main_by_mod.most_common(8)},
        "main_top_symbols_s": {k: round(v * per, 4) for k, v in main_sym.most_common(12)},
        "worker_cpu_s": round(sum(n for t, n in threads.items() if t != pid) * per, 4),
        "worker_threads_s": dict(list(workers.items())[:8]),
        "worker_by_object_s": {k: round(v * per, 4) for k, v in worker_by_mod.most_common(6)},
    }


def analyze(perf_data: str, pid: int, t0: float, t1: float) -> dict[str, Any]:
    r = subprocess.run(["perf", "script", "-i", perf_data, "-F", "pid,tid,time,ip,sym,dso"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"perf script failed: {r.stderr.strip()[:300]}")
    return split(parse_script(r.stdout), pid, t0, t1)
