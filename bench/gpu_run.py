"""One strata run of a GPU probe, recorded (bench/gpu_probe.sh, gpu_memory.sh).

    python bench/gpu_run.py OUT.json strata train ... run.dir=DIR

Runs the command and writes OUT.json: exit code, wall seconds, the children's
peak RSS, start-up and compile figures, the memory, fit and checkpoint
events, the step times and the tail of stderr; prints a one-line summary.
"""
import json
import resource
import subprocess
import sys
import time


def _lines(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def main() -> int:
    out_path, cmd = sys.argv[1], sys.argv[2:]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    run_dir = [a for a in cmd if a.startswith("run.dir=")][-1][len("run.dir="):]
    events = _lines(run_dir + "/events.jsonl")
    first = {}
    for e in events:
        first.setdefault(e.get("event"), e)
    steps = [t for t in (m.get("step_time_s") for m in _lines(run_dir + "/metrics.jsonl")) if t]
    out = {"rc": r.returncode, "wall_s": round(time.time() - t0, 1),
           "maxrss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024,
           "startup_s": first.get("run", {}).get("startup_seconds"),
           "compile_s": first.get("compile", {}).get("seconds"),
           "compile_threads": first.get("compile", {}).get("threads"),
           "cache_hits": first.get("compile", {}).get("cache_hits"),
           "memory": [e for e in events if e.get("event") == "memory"],
           "fit": [e for e in events if e.get("event") in ("fit", "plan")],
           "ckpt": [e for e in events if e.get("event") == "ckpt_saved"],
           "step_times_s": steps, "stderr_tail": r.stderr[-600:]}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    print(out_path.rsplit("/", 1)[-1], {k: v for k, v in out.items() if k not in ("stderr_tail", "memory", "fit", "ckpt")},
          [(m.get("phase"), m.get("rss_bytes")) for m in out["memory"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
