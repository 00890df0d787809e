"""data.packing none/pack and data.sources: the C sampler (`strata data
--fill`, st_dataset_fill) and the Python mirror (strata_jax.data) make the
same sequences bit for bit from the same token files (docs/data.md,
"Packing", "Document stream", "Mixing"); concat keeps positions 0..T-1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")
sys.path.insert(0, os.path.join(ROOT, "python"))
from strata_jax import data as D  # noqa: E402

T = 32


def strata(args: list[str], cache: str, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([STRATA, *args], cwd=ROOT, capture_output=True, timeout=300,
                       env={**os.environ, "STRATA_CACHE_DIR": cache})
    if ok and r.returncode != 0:
        raise AssertionError(f"strata {' '.join(args)} exited {r.returncode}: {r.stderr.decode(errors='replace')}")
    return r


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("corpora")
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]

    def text(n: int) -> str:
        return " ".join(rng.choice(words, size=n)) + "\n"

    # A fortunes-like file: documents separated by "%" lines, some longer than T.
    fort = d / "fort.txt"
    fort.write_text("".join(text(int(rng.integers(1, 14))) + "%\n" for _ in range(60)))
    # A JSONL folder: one document per line (its "body" field), an empty one skipped.
    js = d / "js"
    js.mkdir()
    lines = [json.dumps({"body": text(int(rng.integers(1, 4))), "id": i}) for i in range(40)]
    (js / "a.jsonl").write_text("\n".join(lines) + "\n\n")
    return {"fort": str(fort), "js": str(js), "cache": str(d / "cache")}


def base_args(*extra: str) -> list[str]:
    return ["configs/test.yml", "data.synthetic=false", "model.vocab_size=256", f"model.seq_len={T}",
            "data.val_fraction=0.2", "seed=7", *extra]


def c_fill(args: list[str], cache: str, stream: int, first: int, count: int, out: str) -> tuple[np.ndarray, ...]:
    strata(["data", *args, "--fill", str(stream), str(first), str(count), out], cache)
    a = np.fromfile(out, dtype="<i4")
    n = count * T
    assert a.size == 4 * n
    return (a[:n].reshape(count, T), a[n:2 * n].reshape(count, T), a[2 * n:3 * n].view("<f4").reshape(count, T),
            a[3 * n:].reshape(count, T))


def sources_of(args: list[str], cache: str) -> list[tuple[str, float]]:
    out = strata(["data", *args], cache).stdout.decode().splitlines()
    src = [line.split() for line in out if line.startswith("source ")]
    return [(f[f.index("token_file") + 1], float(f[f.index("weight") + 1])) for f in src]


def py_sampler(args: list[str], cache: str, packing: str, weights: list[float] | None = None) -> D.Sampler:
    sources = []
    for i, (tok, _) in enumerate(sources_of(args, cache)):
        tokens, _, starts = D.read_token_file_docs(tok)
        assert starts is not None, "packing none/pack writes version 3"
        sources.append(D.Source(tokens, starts, weights[i] if weights else 1.0))
    return D.Sampler(None, seed=7, val_fraction=0.2, seq_len=T, batch_size=4, microbatches=2, packing=packing,
                     sources=sources)


def check_invariants(x, y, w, pos) -> None:
    for i in range(x.shape[0]):
        # Padding: weight 0, ids 0, and it ends the sequence.
        pad = w[i] == 0
        assert (x[i][pad] == 0).all() and (y[i][pad] == 0).all()
        # Inside a segment, positions count up by one; a segment starts where position is 0.
        for t in range(1, T):
            assert pos[i, t] == 0 or pos[i, t] == pos[i, t - 1] + 1
            if pos[i, t] != 0:
                assert w[i, t] == w[i, t - 1]
                assert x[i, t] == y[i, t - 1]  # the same document continues


@pytest.mark.parametrize("packing", ["none", "pack"])
def test_c_and_python_make_the_same_sequences(corpora, tmp_path, packing):
    args = base_args(f"data.packing={packing}", f"data.sources=[{corpora['fort']}, {corpora['js']}]",
                     "data.weights=[3, 1.5]", "data.separator=%", "data.jsonl_field=body")
    py = py_sampler(args, corpora["cache"], packing, [3, 1.5])
    # In order, then an earlier index (the C cursor replays), for both streams.
    for stream, first, count in ((0, 0, 16), (0, 16, 24), (0, 5, 7), (1, 0, 12), (0, 40, 3)):
        c = c_fill(args, corpora["cache"], stream, first, count, str(tmp_path / "f.bin"))
        p = py.fill(stream, first, count)
        for a, b in zip(c, p):
            np.testing.assert_array_equal(a, b)
        check_invariants(*c)
    # Padding is present, and a separator line is in no document.
    x, y, w, pos = c_fill(args, corpora["cache"], 0, 0, 32, str(tmp_path / "f.bin"))
    assert (w == 0).any() and (w == 1).any()
    assert b"%\n" not in bytes(x[w == 1].astype(np.uint8))
    # The batch type carries positions.
    b = py.batch(1)
    assert b.positions.shape == (2, 2, T) and b.positions.dtype == np.int32


def test_concat_positions_and_batches(corpora, tmp_path):
    args = base_args(f"data.path={corpora['fort']}")
    tok = strata(["data", *args], corpora["cache"]).stdout.decode().splitlines()[0]
    tokens, _, starts = D.read_token_file_docs(tok)
    assert starts is None  # concat writes version 2, as before
    py = D.Sampler(tokens, seed=7, val_fraction=0.2, seq_len=T, batch_size=4, microbatches=2)
    c = c_fill(args, corpora["cache"], 0, 3, 8, str(tmp_path / "f.bin"))
    for a, b in zip(c, py.fill(0, 3, 8)):
        np.testing.assert_array_equal(a, b)
    assert (c[3] == np.arange(T)).all() and (c[2] == 1).all()


def test_synthetic_documents(corpora, tmp_path):
    args = ["configs/test.yml", "data.synthetic=true", f"model.seq_len={T}", "data.val_fraction=0.2", "seed=7",
            "data.packing=pack"]
    tok = strata(["data", *args], corpora["cache"]).stdout.decode().splitlines()[0]
    tokens, _, starts = D.read_token_file_docs(tok)
    py = D.Sampler(tokens, seed=7, val_fraction=0.2, seq_len=T, batch_size=4, microbatches=2, packing="pack",
                   starts=starts)
    c = c_fill(args, corpora["cache"], 0, 0, 10, str(tmp_path / "f.bin"))
    for a, b in zip(c, py.fill(0, 0, 10)):
        np.testing.assert_array_equal(a, b)


def test_refusals(corpora, tmp_path):
    cache = corpora["cache"]
    # A version-2 token file with packing pack: exit 3 naming the file.
    tok = strata(["data", *base_args(f"data.path={corpora['fort']}")], cache).stdout.decode().splitlines()[0]
    r = strata(["data", *base_args(f"data.path={tok}", "data.packing=pack")], cache, ok=False)
    assert r.returncode == 3 and tok in r.stderr.decode() and "version-3" in r.stderr.decode()
    # Too few documents: exit 3 naming the source.
    one = tmp_path / "one.txt"
    one.write_text("just one document\n")
    r = strata(["data", *base_args(f"data.sources=[{one}]", "data.weights=[1]", "data.packing=none")], cache, ok=False)
    assert r.returncode == 3 and str(one) in r.stderr.decode()
    # data.sources with concat, mismatched weights, bpe with pack: exit 2 naming the keys.
    for extra, key in (([f"data.sources=[{one}]", "data.weights=[1]"], "data.packing"),
                       ([f"data.sources=[{one}]", "data.weights=[1, 2]", "data.packing=pack"], "data.weights"),
                       ([f"data.sources=[{one}]", "data.weights=[0]", "data.packing=pack"], "data.weights"),
                       (["data.tokenizer=bpe", "data.packing=pack"], "data.tokenizer")):
        r = strata(["data", *base_args(*extra)], cache, ok=False)
        assert r.returncode == 2 and key in r.stderr.decode(), r.stderr.decode()
