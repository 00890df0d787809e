"""ckpt_drill.py — helpers for tests/e2e/test_ckpt.sh (not a test itself).

  kill   the kill drill: SIGKILL a training run at random moments (mid-step
         and mid-save), resume it each time, then let it finish.
  same   final parameters bitwise identical, and the loss of every step
         (replays included) equal to an uninterrupted run.
  fixmanifest  rewrite a manifest field and recompute manifest_xxh64 (with
         libxxhash through ctypes), to build "valid but foreign" checkpoints.
  shape  change a tensor's shape in a safetensors header, same byte length.

Every random choice comes from a printed seed, so a failing drill can be
rerun with the same schedule (timing still varies from run to run).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import json
import os
import random
import signal
import subprocess
import sys
import time


def metrics_steps(path: str) -> int:
    """Number of step lines (with a loss) in metrics.jsonl."""
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if '"loss"' in line)
    except FileNotFoundError:
        return 0


def temporaries(run: str) -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(run, "checkpoints", ".tmp-*")))


def last_step(path: str) -> int:
    """The step of the last step line in metrics.jsonl."""
    step = 0
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if '"loss"' in line:
                    step = json.loads(line)["step"]
    except FileNotFoundError:
        pass
    return step


def kill_drill(args: argparse.Namespace) -> int:
    run = args.dir
    metrics = os.path.join(run, "metrics.jsonl")
    log = open(os.path.join(os.path.dirname(run), os.path.basename(run) + ".log"), "ab")
    first = [args.strata, "train", *args.config, f"run.dir={run}"]
    resume = [args.strata, "resume", run]
    print(f"kill drill: base seed {args.seed}, {args.kills} kills, command: {' '.join(first[1:])}")
    kills = []
    attempt = 0
    while len(kills) < args.kills:
        seed = args.seed * 1000 + attempt
        rng = random.Random(seed)
        mode = "save" if attempt % 2 else "step"
        cmd = first if attempt == 0 else resume
        attempt += 1
        base = metrics_steps(metrics)
        # Leftovers of the previous kill are this attempt's to clean up, not its saves.
        before = set(temporaries(run))
        p = subprocess.Popen(cmd, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        killed = False
        if mode == "step":
            # Some steps into this attempt, then a random instant within a step or two.
            need = base + rng.randint(1, 8)
            delay = rng.uniform(0, 0.006)
            while p.poll() is None and metrics_steps(metrics) < need and time.monotonic() < deadline:
                time.sleep(0.0005)
            time.sleep(delay)
        else:
            # When the k-th save of this attempt has its temporary folder, a random instant into the write.
            k = rng.randint(1, 2)
            delay = rng.uniform(0, 0.004)
            seen: set[str] = set()
            while p.poll() is None and time.monotonic() < deadline:
                seen |= set(temporaries(run)) - before
                if len(seen) >= k:
                    break
                time.sleep(0.0002)
            time.sleep(delay)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed = True
        rc = p.wait()
        if not killed:
            print(f"FAIL: attempt {attempt} ended (rc {rc}) before its kill, after {len(kills)} kills: "
                  "give the drill more steps", file=sys.stderr)
            return 1
        tmps = sorted(set(temporaries(run)) - before)
        where = "mid-save" if tmps else "mid-step"
        kills.append(where)
        print(f"  kill {len(kills):2d}: seed {seed} mode {mode} delay {delay * 1e3:.2f} ms -> {where} "
              f"(last step recorded {last_step(metrics)}, rc {rc}{', partial ' + tmps[0] if tmps else ''})")
    p = subprocess.run(resume, stdout=log, stderr=log)
    print(f"  final resume: rc {p.returncode}")
    summary = {"kills": len(kills), "mid_step": kills.count("mid-step"), "mid_save": kills.count("mid-save")}
    print(f"kill drill: {summary['kills']} kills ({summary['mid_step']} mid-step, {summary['mid_save']} mid-save)")
    with open(os.path.join(os.path.dirname(run), os.path.basename(run) + ".kills.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f)
    return p.returncode


def load_metrics(path: str) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    losses: dict[int, list[float]] = {}
    evals: dict[int, list[float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = json.loads(line)
            if "loss" in m:
                losses.setdefault(m["step"], []).append(m["loss"])
            if "eval_loss" in m:
                evals.setdefault(m["step"], []).append(m["eval_loss"])
    return losses, evals


def same(args: argparse.Namespace) -> int:
    ref, got = args.ref, args.got
    ok = True
    for name in ["params.safetensors"] + [os.path.join("checkpoints", args.final, f)
                                           for f in ("params.safetensors", "optimizer.safetensors")] * bool(args.final):
        a = open(os.path.join(ref, name), "rb").read()
        b = open(os.path.join(got, name), "rb").read()
        if a != b:
            diff = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
            print(f"FAIL: {name} differs from the uninterrupted run at byte {diff} ({len(a)} vs {len(b)} bytes)")
            ok = False
        else:
            print(f"  {name}: bitwise identical ({len(a)} bytes)")
    rl, re_ = load_metrics(os.path.join(ref, "metrics.jsonl"))
    gl, ge = load_metrics(os.path.join(got, "metrics.jsonl"))
    replayed = {s: len(v) for s, v in gl.items() if len(v) > 1}
    for s, vals in gl.items():
        want = rl.get(s, [None])[0]
        if any(v != want for v in vals):
            print(f"FAIL: step {s}: losses {vals}, uninterrupted {want}")
            ok = False
    for s, vals in ge.items():
        want = re_.get(s, [None])[0]
        if any(v != want for v in vals):
            print(f"FAIL: eval at step {s}: {vals}, uninterrupted {want}")
            ok = False
    if sorted(gl) != sorted(rl):
        print(f"FAIL: steps recorded differ: {sorted(set(rl) ^ set(gl))}")
        ok = False
    if ok:
        print(f"  losses: {len(gl)} steps equal to the uninterrupted run; {len(replayed)} steps replayed "
              f"({sum(replayed.values()) - len(replayed)} extra lines), all identical")
    if args.min_replayed and len(replayed) < args.min_replayed:
        print(f"FAIL: only {len(replayed)} replayed steps, expected at least {args.min_replayed}")
        ok = False
    return 0 if ok else 1


def xxh64(data: bytes) -> int:
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
    lib.XXH64.restype = ctypes.c_uint64
    lib.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
    return lib.XXH64(data, len(data), 0)


def fix_manifest(args: argparse.Namespace) -> int:
    """Sets KEY to VALUE (JSON) in a manifest and re-signs it as strata does:
    xxh64 of every byte before the manifest_xxh64 line."""
    path = os.path.join(args.ckpt, "manifest.json")
    text = open(path, encoding="utf-8").read()
    m = json.loads(text)
    m[args.key] = json.loads(args.value)
    del m["manifest_xxh64"]
    body = "{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in m.items())
    digest = xxh64(body.encode())
    with open(path, "w", encoding="utf-8") as f:
        f.write(body + f'  "manifest_xxh64": "{digest:016x}"\n}}\n')
    return 0


def shape(args: argparse.Namespace) -> int:
    """Replaces the text OLD by NEW (same length) in a safetensors header."""
    data = bytearray(open(args.file, "rb").read())
    n = int.from_bytes(data[:8], "little")
    head = data[8:8 + n]
    assert len(args.old) == len(args.new), "same length keeps every offset"
    i = head.find(args.old.encode())
    assert i >= 0, f"{args.old!r} not in the header"
    data[8 + i:8 + i + len(args.new)] = args.new.encode()
    open(args.file, "wb").write(bytes(data))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kill")
    k.add_argument("--strata", required=True)
    k.add_argument("--dir", required=True)
    k.add_argument("--kills", type=int, default=10)
    k.add_argument("--seed", type=int, required=True)
    k.add_argument("config", nargs="+")
    s = sub.add_parser("same")
    s.add_argument("ref")
    s.add_argument("got")
    s.add_argument("--final", default="")
    s.add_argument("--min-replayed", type=int, default=0)
    f = sub.add_parser("fixmanifest")
    f.add_argument("ckpt")
    f.add_argument("key")
    f.add_argument("value")
    h = sub.add_parser("shape")
    h.add_argument("file")
    h.add_argument("old")
    h.add_argument("new")
    a = ap.parse_args()
    return {"kill": kill_drill, "same": same, "fixmanifest": fix_manifest, "shape": shape}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
