"""compare.py REF_OUT CUR_OUT [--mask-keys] — the comparing half of
tests/identity/check.sh (read its header first).

Each side's folder holds plans/ and exports/ (LABEL.out, .err, .rc of one
strata command each), cache/bundles/<key>/ (the exported bundles) and
runs/<label>/ (a training run directory). Everything is compared byte for
byte, but for the fields named in VOLATILE_* below, which carry a time, a
duration or a rate (the paths are the same on both sides: check.sh runs
both with the same cache and run directories). With --mask-keys (the
exporter's sources differ, and the bundle key hashes them) each bundle key
is replaced by the label of the export that made it.

Exit 0 when identical, 1 naming what differs and showing the first
difference as a unified diff.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
from pathlib import Path

# A checkpoint manifest's fields that differ between two identical runs:
# its creation time, and the checksum of the manifest text (which includes
# that time). Everything else, config and paths included, must be equal.
VOLATILE_MANIFEST = ("created", "manifest_xxh64")
# A metrics line's values that are measured, not computed: wall times
# (*_s), rates (*_per_s, mfu), what depends on the timing of the device's
# queue (overlaps, blocked waits, collectives waited for, how many launches
# were in flight), and ckpt_bytes, whose manifest part holds the text of its
# creation time (its length varies). Their keys are still compared, line by
# line.
VOLATILE_METRICS_SUFFIX = ("_s",)
VOLATILE_METRICS = ("tokens_per_s", "model_flops_per_s", "mfu", "overlap_ratio", "comm_overlap_ratio", "max_inflight",
                    "waits_blocked", "comm_waits", "ckpt_mb_per_s", "ckpt_bytes")
# events.jsonl: the sequence of event names is compared whole; these events
# are computed, not measured, and are compared whole but for their time and,
# in the fit event, the memory the host had available at that moment (on
# the CPU plugin the device's limit is read from MemAvailable).
DETERMINISTIC_EVENTS = ("data", "bundle", "fit", "plan", "eval")
VOLATILE_EVENT_FIELDS = ("time", "device_memory_bytes", "device_memory_source", "host_memory")

KEY = re.compile(r"\b[0-9a-f]{16}\b")


class Side:
    def __init__(self, root: Path, mask: bool) -> None:
        self.root = root
        self.mask = mask
        self.names: dict[str, str] = {}
        if mask:
            self._name_keys()

    def _name_keys(self) -> None:
        """Bundle key -> the first export (in label order) that printed it."""
        bundles = self.root / "cache" / "bundles"
        known = {p.name.split(".")[0] for p in bundles.iterdir()} if bundles.is_dir() else set()
        for out in sorted((self.root / "exports").glob("*.out")):
            label = out.name[:-4]
            text = out.read_text(errors="surrogateescape") + out.with_suffix(".err").read_text(errors="surrogateescape")
            for k in KEY.findall(text):
                if k in known:
                    self.names.setdefault(k, f"<bundle:{label}>")
        for i, k in enumerate(sorted(known - set(self.names))):
            self.names[k] = f"<bundle:unexported-{i}>"

    def text(self, data: bytes) -> bytes:
        if not self.mask:
            return data
        s = data.decode("utf-8", errors="surrogateescape")
        s = KEY.sub(lambda m: self.names.get(m.group(0), m.group(0)), s)
        return s.encode("utf-8", errors="surrogateescape")


class Report:
    """What differs, by kind (plan, export, bundle, run), with each kind's first difference as a diff."""

    def __init__(self) -> None:
        self.diffs: dict[str, list[str]] = {}
        self.first: dict[str, str] = {}

    def differ(self, what: str, a: bytes | str | None, b: bytes | str | None) -> None:
        kind = what.split("/")[0].split(" ")[0]
        self.diffs.setdefault(kind, []).append(what)
        if kind in self.first:
            return
        if a is None or b is None:
            self.first[kind] = f"{what}: only on the {'cur' if a is None else 'ref'} side"
            return
        if isinstance(a, bytes) and isinstance(b, bytes) and (b"\0" in a or b"\0" in b):
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            self.first[kind] = (f"{what}: binary contents differ ({len(a)} bytes before, {len(b)} after; "
                                f"first at byte {at})")
            return
        ta = a.decode("utf-8", errors="replace") if isinstance(a, bytes) else a
        tb = b.decode("utf-8", errors="replace") if isinstance(b, bytes) else b
        lines = list(difflib.unified_diff(ta.splitlines(), tb.splitlines(), f"ref/{what}", f"cur/{what}", lineterm="", n=2))
        if not lines:
            lines = [f"{what}: contents differ ({len(a)} before, {len(b)} after) but not line by line"]
        self.first[kind] = "\n".join(line[:300] for line in lines[:24])


def files_under(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()) if d.is_dir() else []


def compare_tree(rep: Report, ref: Side, cur: Side, sub: str, tag: str) -> int:
    """Every file of ref/SUB and cur/SUB, keys masked; returns how many ref has."""
    a_dir, b_dir = ref.root / sub, cur.root / sub
    names = files_under(a_dir)
    for name in sorted(set(names) | set(files_under(b_dir))):
        a = (a_dir / name).read_bytes() if (a_dir / name).is_file() else None
        b = (b_dir / name).read_bytes() if (b_dir / name).is_file() else None
        if a is None or b is None or ref.text(a) != cur.text(b):
            rep.differ(f"{tag}/{name}", a and ref.text(a), b and cur.text(b))
    return len(names)


def bundle_dir(side: Side, label: str) -> Path | None:
    out = side.root / "exports" / f"{label}.out"
    if not out.is_file():
        return None
    m = re.search(r"(\S+/bundles/[0-9a-f]{16}) ", out.read_text())
    return Path(m.group(1)) if m else None


def compare_bundles(rep: Report, ref: Side, cur: Side) -> tuple[int, int]:
    files = bundles = 0
    seen: set[str] = set()
    for out in sorted((ref.root / "exports").glob("*.out")):
        label = out.name[:-4]
        a, b = bundle_dir(ref, label), bundle_dir(cur, label)
        if a is None:  # a refused export: its message is compared with the exports' outputs
            continue
        # The printed path is the shared cache path; the bundle now lies in the side's cache copy.
        a = ref.root / "cache" / "bundles" / a.name
        if a.name in seen:
            continue
        seen.add(a.name)
        bundles += 1
        if b is None:
            rep.differ(f"bundle {label}: not exported on the cur side", "", "")
            continue
        b = cur.root / "cache" / "bundles" / b.name
        names = files_under(a)
        files += len(names)
        for name in sorted(set(names) | set(files_under(b))):
            fa, fb = a / name, b / name
            da = fa.read_bytes() if fa.is_file() else None
            db = fb.read_bytes() if fb.is_file() else None
            if da is None or db is None or ref.text(da) != cur.text(db):
                rep.differ(f"bundle {label}/{name}", da and ref.text(da), db and cur.text(db))
    return files, bundles


def manifest_text(side: Side, data: bytes) -> str:
    m = json.loads(side.text(data))
    for k in VOLATILE_MANIFEST:
        m.pop(k, None)
    return json.dumps(m, indent=1)


def metrics_text(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        m = json.loads(line)
        kept = {k: (v if not (k in VOLATILE_METRICS or k.endswith(VOLATILE_METRICS_SUFFIX)) else "<measured>")
                for k, v in m.items()}
        lines.append(json.dumps(kept))
    return "\n".join(lines)


def events_text(side: Side, path: Path) -> str:
    names, kept = [], []
    for line in path.read_text().splitlines():
        e = json.loads(side.text(line.encode()))
        names.append(e.get("event", "?"))
        if e.get("event") in DETERMINISTIC_EVENTS:
            for k in VOLATILE_EVENT_FIELDS:
                e.pop(k, None)
            kept.append(json.dumps(e))
    return "events: " + " ".join(names) + "\n" + "\n".join(kept)


def compare_runs(rep: Report, ref: Side, cur: Side) -> tuple[int, int]:
    files = runs = 0
    for rc in sorted((ref.root / "runs").glob("*.rc")):
        label = rc.name[:-3]
        runs += 1
        a_rc, b_rc = rc.read_text(), (cur.root / "runs" / rc.name)
        b_txt = b_rc.read_text() if b_rc.is_file() else None
        if a_rc != b_txt:
            rep.differ(f"run {label}: exit status", a_rc, b_txt)
        a, b = ref.root / "runs" / label, cur.root / "runs" / label
        names = [n for n in files_under(a) if n.startswith("checkpoints/") or n == "params.safetensors"]
        files += len(names)
        both = sorted(set(names) | {n for n in files_under(b) if n.startswith("checkpoints/") or n == "params.safetensors"})
        for name in both + ["config.yaml", "metrics.jsonl", "events.jsonl"]:
            fa, fb = a / name, b / name
            if not fa.is_file() or not fb.is_file():
                rep.differ(f"run {label}/{name}", fa.read_bytes() if fa.is_file() else None,
                           fb.read_bytes() if fb.is_file() else None)
                continue
            if name.endswith("manifest.json"):
                ta, tb = manifest_text(ref, fa.read_bytes()), manifest_text(cur, fb.read_bytes())
            elif name == "metrics.jsonl":
                ta, tb = metrics_text(fa), metrics_text(fb)
            elif name == "events.jsonl":
                ta, tb = events_text(ref, fa), events_text(cur, fb)
            else:
                ta, tb = ref.text(fa.read_bytes()), cur.text(fb.read_bytes())
            if ta != tb:
                rep.differ(f"run {label}/{name}", ta, tb)
    return files, runs


def main(argv: list[str]) -> int:
    mask = "--mask-keys" in argv
    args = [a for a in argv if a != "--mask-keys"]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    ref, cur = Side(Path(args[0]), mask), Side(Path(args[1]), mask)
    rep = Report()
    n_outputs = compare_tree(rep, ref, cur, "plans", "plan")
    n_plans = sum(1 for n in files_under(ref.root / "plans") if n.endswith(".out"))
    failed = sum(1 for n in files_under(ref.root / "plans") if n.endswith(".rc")
                 and (ref.root / "plans" / n).read_text().strip() != "0")
    compare_tree(rep, ref, cur, "exports", "export")
    n_bundle_files, n_bundles = compare_bundles(rep, ref, cur)
    n_ckpt_files, n_runs = compare_runs(rep, ref, cur)
    print(f"identity: {n_plans} plans ({failed} of them config or runtime errors, compared too; "
          f"{n_outputs} files with stderr and exit status), {n_bundle_files} bundle files ({n_bundles} bundles), "
          f"{n_ckpt_files} checkpoint files ({n_runs} training runs) compared")
    if mask:
        print("identity: the exporter's sources (python/strata_jax/*.py, *.json) differ, so every bundle key "
              "differs by design; keys were replaced by the name of the export that made them")
    if not rep.diffs:
        print("identity: identical")
        return 0
    total = sum(len(v) for v in rep.diffs.values())
    print(f"identity: DIFFERENT: {total} files differ: "
          + ", ".join(f"{len(v)} {k}" for k, v in rep.diffs.items()))
    for kind, whats in rep.diffs.items():
        print(f"identity: {kind}: {len(whats)} differ" + (", the first 10:" if len(whats) > 10 else ":"))
        for w in whats[:10]:
            print(f"  {w}")
        print(f"identity: the first {kind} difference:")
        print(rep.first[kind])
    return 1

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
