"""The repository stands alone: no tracked file points at a document outside
it. The design blueprint that strata started from lived beside the
repository, never in it; what of it holds is docs/design.md. A reference to
that outside file, or to the folder it sat in, is a dead link for anyone
who has only this repository."""

from __future__ import annotations

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Spelled in pieces so that this file does not match itself: the folder
# beside the repository (relative or absolute), the blueprint's name (also
# as "<name> §N"), and the two requirement documents kept in that folder
# (cited as "seed" and a three-digit number).
OUTSIDE = re.compile(rb"\.\./" rb"shared\b|/work/" rb"shared\b|\bDES" rb"IGN\b|\bseed 0" rb"0[0-9]\b")


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return [p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        # Not a git checkout (an exported tree): every file but build
        # outputs and hidden folders (.venv, .git).
        found = []
        for d, dirs, files in os.walk(ROOT):
            dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
            found += [os.path.relpath(os.path.join(d, f), ROOT) for f in files]
        return found


def test_no_tracked_file_points_outside_the_repository() -> None:
    files = tracked_files()
    assert len(files) > 100, f"only {len(files)} files found under {ROOT}"
    hits = []
    for rel in files:
        path = os.path.join(ROOT, rel)
        if not os.path.isfile(path):  # deleted in the work tree, not yet committed
            continue
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                if OUTSIDE.search(line):
                    hits.append(f"{rel}:{n}: {line.decode(errors='replace').strip()[:120]}")
    assert not hits, "references outside the repository (point at docs/ instead):\n" + "\n".join(hits)


def test_the_check_sees_such_a_reference() -> None:
    # The pattern itself, on the shapes the references took.
    for text in (b"See `../" b"shared/DES" b"IGN.md`.", b"(DES" b"IGN \xc2\xa74)", b"where DES" b"IGN was silent",
                 b"/work/" b"shared/notes/pjrt-facts.md",
                 b"(seed 0" b"00 \xe4\xbb\xbb\xe5\x8a\xa1)"):
        assert OUTSIDE.search(text), text
    for text in (b"docs/design.md", b"shared_ptr", b"the design (docs/design.md, section 4)", b"shared/ folder", b"seed: 0", b"seed 0 and 1"):
        assert not OUTSIDE.search(text), text
