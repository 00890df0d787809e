"""data.packing none/pack and data.sources: the C sampler (`strata data
--fill`, st_dataset_fill) and the Python mirror (strata_jax.data) make the
same sequences bit for bit from the same token files (docs/data.md,
"Packing", "Document stream", "Mixing"); concat keeps positions 0..T-1.
data.tokenizer=bpe makes the byte tokenizer's documents and prompts, each
encoded on its own ("BPE documents").
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
    # Prompt/completion documents (data.prompt_marker=@@@): some with the
    # marker line, some without, one with it first (empty prompt), one with
    # it last (empty completion), some with prompts longer than T.
    qa, prompts = d / "qa.txt", []
    docs = []
    for i in range(60):
        q, a = "Q: " + text(int(rng.integers(1, 12))), "A: " + text(int(rng.integers(1, 8)))
        if i % 3 == 2:
            docs.append(q + a)
            prompts.append(0)
        elif i == 4:
            docs.append("@@@\n" + a)
            prompts.append(0)
        elif i == 7:
            docs.append(q + "@@@\n")
            prompts.append(len(q))
        else:
            docs.append(q + "@@@\n" + a)
            prompts.append(len(q))
    qa.write_text("".join(doc + "%\n" for doc in docs))
    qjs = d / "qjs"
    qjs.mkdir()
    jdocs = ["Q: " + text(int(rng.integers(1, 5))) + ("@@@\n" if i % 2 else "") + "A: " + text(2) for i in range(40)]
    (qjs / "q.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in jdocs))
    jprompts = [t.index("@@@\n") if "@@@\n" in t else 0 for t in jdocs]
    return {"fort": str(fort), "js": str(js), "qa": str(qa), "qa_prompts": prompts, "qjs": str(qjs),
            "qjs_prompts": jprompts, "cache": str(d / "cache")}


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
        tokens, _, starts, prompts = D.read_token_file_prompts(tok)
        assert starts is not None, "packing none/pack writes version 3"
        sources.append(D.Source(tokens, starts, weights[i] if weights else 1.0, prompts))
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


@pytest.mark.parametrize("packing", ["none", "pack"])
def test_prompt_marker(corpora, tmp_path, packing):
    """data.prompt_marker: the token file records each document's prompt,
    the marker line is in no document, and C and Python weigh the prompt's
    targets 0 alike."""
    args = base_args(f"data.packing={packing}", f"data.sources=[{corpora['qa']}, {corpora['qjs']}]",
                     "data.weights=[2, 1]", "data.separator=%", "data.jsonl_field=body", "data.prompt_marker=@@@")
    (qa_tok, _), (qjs_tok, _) = sources_of(args, corpora["cache"])
    for tok, want in ((qa_tok, corpora["qa_prompts"]), (qjs_tok, corpora["qjs_prompts"])):
        tokens, _, starts, prompts = D.read_token_file_prompts(tok)
        assert prompts is not None and list(prompts) == want
        assert b"@@@" not in bytes(tokens.astype(np.uint8))
    # The marker is in the cache key: without it the same corpus makes another file, without prompts.
    plain = base_args(f"data.packing={packing}", f"data.sources=[{corpora['qa']}]", "data.weights=[1]",
                      "data.separator=%")
    (plain_tok, _), = sources_of(plain, corpora["cache"])
    assert plain_tok != qa_tok and D.read_token_file_prompts(plain_tok)[3] is None
    assert b"@@@" in bytes(D.read_token_file(plain_tok)[0].astype(np.uint8))
    py = py_sampler(args, corpora["cache"], packing, [2, 1])
    for stream, first, count in ((0, 0, 24), (0, 24, 16), (0, 3, 9), (1, 0, 12)):
        c = c_fill(args, corpora["cache"], stream, first, count, str(tmp_path / "f.bin"))
        for a, b in zip(c, py.fill(stream, first, count)):
            np.testing.assert_array_equal(a, b)
    x, y, w, pos = c_fill(args, corpora["cache"], 0, 0, 48, str(tmp_path / "f.bin"))
    # Inside a segment the weights are 0 (prompt targets) then 1 (completion): never 1 then 0.
    zero_in_doc = 0
    for i in range(x.shape[0]):
        for t in range(1, T):
            if pos[i, t] != 0:
                assert not (w[i, t - 1] == 1 and w[i, t] == 0)
                assert x[i, t] == y[i, t - 1]
                zero_in_doc += int(w[i, t] == 0 and x[i, t] != 0)
    assert zero_in_doc > 0 and (w == 1).any()
    # A completion's first target ("A" after a question's line) weighs 1: its input is the prompt's last token.
    first_a = (x == ord("\n")) & (y == ord("A"))
    assert first_a.any() and (w[first_a] == 1).all()


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
    # A marker with concat: exit 2 naming both keys; one equal to the separator or of two lines too.
    r = strata(["data", *base_args("data.prompt_marker=@@@")], cache, ok=False)
    assert r.returncode == 2 and "data.prompt_marker" in r.stderr.decode() and "data.packing" in r.stderr.decode()
    for marker in ("%", "a\nb"):  # a real newline
        r = strata(["data", *base_args("data.packing=pack", "data.separator=%", f"data.prompt_marker={marker}")], cache,
                   ok=False)
        assert r.returncode == 2 and "data.prompt_marker" in r.stderr.decode(), r.stderr.decode()
    # data.sources with concat, mismatched weights: exit 2 naming the keys.
    for extra, key in (([f"data.sources=[{one}]", "data.weights=[1]"], "data.packing"),
                       ([f"data.sources=[{one}]", "data.weights=[1, 2]", "data.packing=pack"], "data.weights"),
                       ([f"data.sources=[{one}]", "data.weights=[0]", "data.packing=pack"], "data.weights")):
        r = strata(["data", *base_args(*extra)], cache, ok=False)
        assert r.returncode == 2 and key in r.stderr.decode(), r.stderr.decode()


# data.tokenizer=bpe with packing none/pack: the documents (and prompts) are
# the byte tokenizer's, each encoded on its own by a small BPE.
BPE_VOCAB = 300


def bpe_args(path: str, packing: str, *extra: str) -> list[str]:
    return ["configs/test.yml", "data.synthetic=false", f"model.vocab_size={BPE_VOCAB}", f"model.seq_len={T}",
            "data.val_fraction=0.2", "seed=7", f"data.path={path}", f"data.packing={packing}", *extra]


@pytest.fixture(scope="module")
def bpe_corpora(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("bpe")
    with open("/usr/share/games/fortunes/debian", "rb") as f:
        fortunes = f.read()
    # Separated documents, with text that is not ASCII and bytes that are not UTF-8.
    (d / "sep.txt").write_bytes(fortunes + "Naïve café, 東京 🙂\n%\n".encode() + b"stray \xff\xfe bytes\n%\n")
    # Prompt/completion documents from the same fortunes: a text file (the first
    # line the prompt; every third without a marker; one with an empty prompt)
    # and a JSONL file beside it, one folder.
    docs = [t for t in fortunes.decode().split("%\n") if t.count("\n") >= 2]
    qa = d / "qa"
    qa.mkdir()
    text = []
    for i, t in enumerate(docs):
        first, rest = t.split("\n", 1)
        text.append(t if i % 3 == 2 else "@@@\n" + t if i == 4 else first + "\n@@@\n" + rest)
    (qa / "a.txt").write_text("".join(t + "%\n" for t in text))
    (qa / "b.jsonl").write_text("".join(json.dumps({"body": t.replace("\n", "\n@@@\n", 1)}) + "\n" for t in docs[:20]))
    return {"sep": str(d / "sep.txt"), "qa": str(qa), "cache": str(d / "cache")}


def bpe_decoder(token_file: str):
    """id -> its exact bytes, from the tokenizer.json beside |token_file|."""
    from strata_jax.tokenize import bytes_to_unicode

    inverse = {s: b for b, s in bytes_to_unicode().items()}
    with open(token_file[: -len(".tok")] + ".tokenizer.json") as f:
        vocab = json.load(f)["model"]["vocab"]
    table = {i: bytes(inverse[c] for c in s) for s, i in vocab.items()}
    return lambda ids: b"".join(table[int(i)] for i in ids)


def split_docs(tokens: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
    return [tokens[a:b] for a, b in zip(starts, list(starts[1:]) + [len(tokens)])]


@pytest.mark.parametrize("corpus,extra", [("sep", ["data.separator=%"]),
                                          ("qa", ["data.separator=%", "data.jsonl_field=body",
                                                  "data.prompt_marker=@@@"])])
@pytest.mark.parametrize("packing", ["none", "pack"])
def test_bpe_documents(bpe_corpora, tmp_path, corpus, extra, packing):
    """BPE token files of documents: the same documents and prompts as the
    byte tokenizer's, each document's tokens (and its prompt's) decode to
    exactly its bytes, segments start at documents, and C and Python fill
    the same batches bit for bit."""
    cache, path = bpe_corpora["cache"], bpe_corpora[corpus]
    args = bpe_args(path, packing, "data.tokenizer=bpe", *extra)
    (tok, _), = sources_of(args, cache)
    (byte_tok, _), = sources_of(bpe_args(path, packing, *extra), cache)
    tokens, vocab, starts, prompts = D.read_token_file_prompts(tok)
    btokens, _, bstarts, bprompts = D.read_token_file_prompts(byte_tok)
    assert vocab == BPE_VOCAB and D.token_file_tokenizer(tok) not in ("byte", "none")
    assert (prompts is None) == (bprompts is None) == ("data.prompt_marker=@@@" not in extra)
    decode = bpe_decoder(tok)
    docs, bdocs = split_docs(tokens, starts), split_docs(btokens, bstarts)
    assert len(docs) == len(bdocs) > 20 and len(tokens) < 0.8 * len(btokens)  # BPE merged
    for d, (ids, raw) in enumerate(zip(docs, bdocs)):
        assert decode(ids) == bytes(raw.astype(np.uint8))
        if prompts is not None:
            assert decode(ids[: prompts[d]]) == bytes(raw[: bprompts[d]].astype(np.uint8))
    if prompts is not None:
        assert (prompts > 0).sum() > 10 and (prompts == 0).sum() > 5
    # Segments: each is a slice of one document, from its start unless it
    # continues one at a sequence's start; a prompt's targets weigh 0.
    x, y, w, pos = c_fill(args, cache, 0, 0, 24, str(tmp_path / "f.bin"))
    if prompts is None:
        check_invariants(x, y, w, pos)  # (its constant weights per segment do not hold with prompts)
    seen = 0
    for i in range(x.shape[0]):
        cuts = [t for t in range(T) if pos[i, t] == 0] + [T]
        for a, b in zip(cuts, cuts[1:]):
            seg = np.append(x[i, a:b], y[i, b - 1])
            if not w[i, a:b].any() and not seg.any():
                continue  # padding
            where = [(d, k) for d, doc in enumerate(docs) for k in ([0] if a else range(len(doc)))
                     if k + len(seg) <= len(doc) and (doc[k: k + len(seg)] == seg).all()]
            assert where, f"sequence {i} segment {a}:{b} is in no document"
            if prompts is not None:
                assert any((w[i, a:b] == (k + np.arange(b - a) + 1 >= prompts[d])).all() for d, k in where)
            seen += 1
    assert seen > 10
    py = py_sampler(args, cache, packing)
    for stream, first, count in ((0, 0, 24), (0, 30, 8), (1, 0, 12)):
        c = c_fill(args, cache, stream, first, count, str(tmp_path / "f.bin"))
        for a, b in zip(c, py.fill(stream, first, count)):
            np.testing.assert_array_equal(a, b)
