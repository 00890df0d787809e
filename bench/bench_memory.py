"""Where the memory goes (issue 18): for each preset, strata's predicted
peak (live slots + XLA's temporaries of the running program, from the plan
event) against what the process really grew by, and strata's peak RSS
against the monolithic jax.jit anchor's on the same shape, with both step
times. One invocation, one machine.

Presets: configs/tiny.yml, configs/small.yml and the GPT-2-124M shape of
issue 18 (12 layers, 768 wide, 12 heads, d_ff 2048, vocab 50304, batch 4 x
64 tokens), all on synthetic data, default policies. Each runs --steps
steps in its own `strata train` process and its own anchor process
(`python -m strata_jax.anchor --variant unroll`), strata from a warm
executable cache (one 1-step run first); RSS is sampled every
0.05 s from /proc/PID/status (the peak of the samples, and the kernel's
ru_maxrss for the anchor).

"measured" is the process's peak RSS minus its RSS once the plugin has
loaded (the `memory` events' baseline + plugin), the issue's "RSS growth
over the process's baseline after the plugin has loaded"; the target is
predicted within 10 % of it. Step times are medians after --skip steps;
other load on the machine makes them noisy (the load average is printed).

Writes bench/results/bench_memory.json and prints a Markdown table.
Usage: python bench/bench_memory.py [--steps N] [--skip K] [--presets tiny,small,gpt2] [--strata PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["data.synthetic=true", "train.eval_every=0", "train.eval_batches=1", "run.progress=off"]
PRESETS: dict[str, tuple[str, list[str]]] = {
    "tiny": ("configs/tiny.yml", []),
    "small": ("configs/small.yml", []),
    "gpt2": ("configs/tiny.yml", ["model.n_layers=12", "model.d_model=768", "model.n_heads=12", "model.d_ff=2048",
                                  "model.vocab_size=50304", "model.seq_len=64", "train.batch_size=4"]),
}


def sample_rss(cmd: list[str], env: dict[str, str]) -> tuple[int, int, str]:
    """Runs |cmd|; returns (exit code, peak sampled RSS in bytes, stderr tail)."""
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def poll() -> None:
        path = f"/proc/{p.pid}/status"
        while p.poll() is None:
            try:
                for line in open(path, encoding="ascii"):
                    if line.startswith("VmRSS:"):
                        peak[0] = max(peak[0], int(line.split()[1]) * 1024)
            except OSError:
                pass
            time.sleep(0.05)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    _, err = p.communicate()
    t.join()
    return p.returncode, peak[0], (err or "")[-1500:]


def jsonl(path: str) -> list[dict]:
    try:
        return [json.loads(line) for line in open(path, encoding="utf-8")]
    except OSError:
        return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--presets", default="tiny,small,gpt2")
    ap.add_argument("--strata", default=os.environ.get("STRATA", os.path.join(ROOT, "build", "strata")))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "bench_memory.json"))
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="strata-bench-memory-")
    env = {**os.environ, "STRATA_CACHE_DIR": os.path.join(work, "cache"), "STRATA_BIN": a.strata}
    rows, out = [], {"load_before": os.getloadavg(), "presets": {}}
    # Header first and a row per preset as it is measured: under bench/run.py's
    # extra-section timeout the finished rows still come out.
    print(f"Memory (issue 18), {a.steps} steps, load average {out['load_before'][0]:.1f} at the start\n")
    print("| preset | predicted peak (slots + temporaries) | measured (peak RSS - RSS after plugin) | predicted / measured "
          "| strata peak RSS | anchor peak RSS | strata / anchor | strata step | anchor step |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for name in a.presets.split(","):
        config, ov = PRESETS[name]
        args = [config, *ov, *COMMON, f"train.steps={a.steps}"]
        run_dir = os.path.join(work, name)
        # A warm cache first: the measured run loads its executables (a cold
        # compile's heap would count as the step's memory).
        subprocess.run([a.strata, "train", config, *ov, *COMMON, "train.steps=1", f"run.dir={run_dir}-warm"], cwd=ROOT,
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rc, peak, err = sample_rss([a.strata, "train", *args, f"run.dir={run_dir}"], env)
        if rc != 0:
            print(f"strata train {name}: exit {rc}: {err}", file=sys.stderr)
            return 1
        ev = jsonl(os.path.join(run_dir, "events.jsonl"))
        mem = {e["phase"]: e for e in ev if e.get("event") == "memory"}
        plan = next(e for e in ev if e.get("event") == "plan")
        steps = [m["step_time_s"] for m in jsonl(os.path.join(run_dir, "metrics.jsonl")) if "step_time_s" in m]
        cat = mem["start"]["categories"]
        after_plugin = cat["baseline"] + cat["plugin"]
        predicted = plan.get("predicted_peak_with_temps_bytes", plan["predicted_peak_bytes"])
        peak = max(peak, mem["peak"]["hwm_bytes"])
        measured = peak - after_plugin
        anchor_json = os.path.join(work, f"{name}-anchor.json")
        arc, apeak, aerr = sample_rss([sys.executable, "-m", "strata_jax.anchor", *args, "--variant", "unroll",
                                       "--steps", str(a.steps), "--out", anchor_json], env)
        anchor = json.load(open(anchor_json)) if arc == 0 else {}
        if arc != 0:
            print(f"anchor {name}: exit {arc}: {aerr}", file=sys.stderr)
        apeak = max(apeak, anchor.get("peak_rss_bytes") or 0)
        at = anchor.get("step_time_s", [])[a.skip:]
        res = {"predicted_peak_bytes": predicted, "slots_peak_bytes": plan["predicted_peak_bytes"],
               "rss_after_plugin_bytes": after_plugin, "peak_rss_bytes": peak, "measured_growth_bytes": measured,
               "predicted_over_measured": predicted / measured if measured > 0 else None,
               "anchor_peak_rss_bytes": apeak or None, "strata_over_anchor": peak / apeak if apeak else None,
               "step_s": statistics.median(steps[a.skip:]) if steps[a.skip:] else None,
               "anchor_step_s": statistics.median(at) if at else None,
               "memory_peak": mem["peak"]}
        out["presets"][name] = res
        gb = lambda n: f"{n / 1e9:.3f} GB" if n else "—"
        rows.append(f"| {name} | {gb(predicted)} | {gb(measured)} | {res['predicted_over_measured']:.3f} | {gb(peak)} | "
                    f"{gb(apeak)} | {res['strata_over_anchor']:.3f} | " if apeak else
                    f"| {name} | {gb(predicted)} | {gb(measured)} | {res['predicted_over_measured']:.3f} | {gb(peak)} | — | — | ")
        rows[-1] += f"{res['step_s'] or float('nan'):.3f} s | {res['anchor_step_s'] or float('nan'):.3f} s |"
        print(rows[-1], flush=True)
    out["load_after"] = os.getloadavg()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    json.dump(out, open(a.out, "w"), indent=1)
    print(f"\nload average at the end {out['load_after'][0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
