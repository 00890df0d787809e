"""`strata data inspect` (docs/data.md, "Inspecting a batch") on
configs/tiny.yml: with packing the fortunes are split at their `%` lines,
positions restart at each document, padding weighs 0; without it one
window per sequence, every target weighing 1."""

from __future__ import annotations

import json
import subprocess

from trainrun import ROOT, STRATA

PACK = ["data.packing=pack", "data.separator=%"]


def inspect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([STRATA, "data", "inspect", "configs/tiny.yml", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def batch(*args: str) -> dict:
    r = inspect(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_packed_batch_shows_documents_positions_and_padding() -> None:
    b = batch(*PACK, "--step", "2", "--microbatch", "0")
    assert b["step"] == 2 and len(b["sequences"]) == 16
    multi = padded = 0
    for seq in b["sequences"]:
        pos, seg, w = seq["positions"], seq["segment_ids"], seq["weights"]
        assert len(pos) == len(seg) == len(w) == 128
        # positions restart exactly where a segment starts, and count up in it
        for i in range(128):
            assert (pos[i] == 0) == (i == 0 or seg[i] != seg[i - 1])
            if i and seg[i] == seg[i - 1]:
                assert pos[i] == pos[i - 1] + 1
        segs = seq["segments"]
        assert [s["start"] for s in segs] == [i for i in range(128) if pos[i] == 0]
        multi += len(segs) > 1
        for s in segs:
            # no fortune's separator line inside a document
            assert "\n%\n" not in s["text"] and not s["text"].startswith("%\n")
        last = segs[-1]
        if all(x == 0 for x in w[last["start"]:last["end"]]) and all(t == 0 for t in seq["inputs"][last["start"]:]):
            padded += 1
        # only padding weighs 0 here (no prompt marker): every real target weighs 1
        for s in segs[:-1]:
            assert all(x == 1 for x in w[s["start"]:s["end"]])
    assert multi > 0, "no sequence packs two documents"
    assert padded > 0, "no sequence ends in padding"


def test_packed_text_has_the_attention_picture() -> None:
    r = inspect(*PACK, "--step", "1", "--sequence", "1")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.count("\nsequence ") == 1 and "segment 1:" in out
    pic = [line.strip() for line in out.splitlines() if line.startswith("    ") and set(line.strip()) <= set("#+.")]
    assert len(pic) == 64
    # block-diagonal: the first cell row sees only its own cell, the last row
    # does not see the first key cell when the sequence holds two documents
    assert pic[0].startswith("+.") and pic[-1][0] == "."


def test_unpacked_batch_is_one_window_per_sequence() -> None:
    b = batch("--step", "1", "--sequence", "0")
    (seq,) = b["sequences"]
    assert seq["positions"] == list(range(128)) and set(seq["segment_ids"]) == {0}
    assert set(seq["weights"]) == {1.0}


def test_bad_step_is_a_usage_error() -> None:
    for args in (["--step", "0"], ["--microbatch", "0"], ["--step", "601"], ["--step", "1", "--sequence", "16"]):
        r = inspect(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "--step" in r.stderr or "--sequence" in r.stderr


def test_document_keys_under_concat_are_said_to_do_nothing() -> None:
    r = subprocess.run([STRATA, "data", "configs/tiny.yml", "data.separator=%"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "data.separator has no effect with data.packing=concat" in r.stderr
