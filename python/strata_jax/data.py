"""Token files, split and sampler of docs/data.md, bit-exact with src/data/.

Used by the monolithic reference and the tests only.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"STRATOK1"
HEADER = struct.Struct("<8sIIIIQ")  # version 1: magic, version, vocab, token_bytes, reserved, count
# version 2: magic, version, vocab, token_bytes, tokenizer kind, count, tokenizer hash, reserved
HEADER_V2 = struct.Struct("<8sIIIIQ8s8s")
KIND_NONE, KIND_BYTE, KIND_BPE = 0, 1, 2  # the tokenizer kinds of a version-2 header
VERSION_DOCS = 3  # version 3: the version-2 header, document count at offset 40, a u64 table after the tokens
FLAG_PROMPTS = 0x1  # version 3: flags in the kind field's high 16 bits; this one: a u64 prompt table follows
PACKINGS = ("concat", "none", "pack")
MASK64 = (1 << 64) - 1
TRAIN_STREAM = 0
EVAL_STREAM = 1


class DataError(Exception):
    """A malformed token file (the C side exits with code 3)."""


def token_file_tokenizer(path: str) -> str:
    """The tokenizer a token file records: "byte", "none" or BPE's 16-hex hash (docs/data.md)."""
    with open(path, "rb") as f:
        raw = f.read(HEADER_V2.size)
    magic, version = struct.unpack_from("<8sI", raw)
    if magic != MAGIC or version not in (1, 2, VERSION_DOCS):
        raise DataError(f"{path}: not a token file")
    if version == 1:
        return "byte"
    kind, digest = HEADER_V2.unpack_from(raw)[4], HEADER_V2.unpack_from(raw)[6]
    if version == VERSION_DOCS:
        kind &= 0xFFFF  # the high half is version 3's flags
    return {KIND_NONE: "none", KIND_BYTE: "byte"}.get(kind, digest.hex())


def read_token_file(path: str) -> tuple[np.ndarray, int]:
    """Returns (tokens as int64 array, vocab_size); validates the whole file."""
    tokens, vocab, _ = read_token_file_docs(path)
    return tokens, vocab


def read_token_file_docs(path: str) -> tuple[np.ndarray, int, np.ndarray | None]:
    """(tokens as int64, vocab_size, document starts as int64 or None for
    versions 1 and 2); validates the whole file as st_token_file_parse does."""
    tokens, vocab, starts, _ = read_token_file_prompts(path)
    return tokens, vocab, starts


def read_token_file_prompts(path: str) -> tuple[np.ndarray, int, np.ndarray | None, np.ndarray | None]:
    """read_token_file_docs and the prompt lengths per document (int64;
    None when the file has no prompt table, i.e. every document is all
    completion)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < HEADER.size:
        raise DataError(f"{path}: too short for a token file header")
    magic, version, vocab, token_bytes, kind, count = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise DataError(f"{path}: bad magic {magic!r}")
    if version not in (1, 2, VERSION_DOCS):
        raise DataError(f"{path}: unsupported version {version}")
    header = HEADER.size if version == 1 else HEADER_V2.size
    if len(raw) < header:
        raise DataError(f"{path}: too short for a version-{version} token file header")
    flags = kind >> 16 if version == VERSION_DOCS else 0
    if version == VERSION_DOCS:
        kind &= 0xFFFF
    if flags & ~FLAG_PROMPTS:
        raise DataError(f"{path}: unknown version-3 flags {flags:#x}")
    if version >= 2 and kind not in (KIND_NONE, KIND_BYTE, KIND_BPE):
        raise DataError(f"{path}: unknown tokenizer kind {kind}")
    if token_bytes not in (2, 4):
        raise DataError(f"{path}: token_bytes must be 2 or 4, got {token_bytes}")
    n_docs = struct.unpack_from("<Q", raw, 40)[0] if version == VERSION_DOCS else 0
    if version == VERSION_DOCS and n_docs == 0:
        raise DataError(f"{path}: version 3 with no documents")
    tables = 2 if flags & FLAG_PROMPTS else 1
    if len(raw) != header + count * token_bytes + 8 * n_docs * tables:
        raise DataError(f"{path}: size {len(raw)} != {header} + {count} * {token_bytes} + 8 * {n_docs} * {tables}")
    if count == 0:
        raise DataError(f"{path}: no tokens")
    dtype = np.dtype("<u2" if token_bytes == 2 else "<u4")
    tokens = np.frombuffer(raw, dtype=dtype, offset=header, count=count).astype(np.int64)
    if int(tokens.max()) >= vocab:
        raise DataError(f"{path}: token {int(tokens.max())} >= vocab_size {vocab}")
    starts = None
    if n_docs:
        starts = np.frombuffer(raw, dtype="<u8", offset=header + count * token_bytes, count=n_docs).astype(np.int64)
        if starts[0] != 0 or (np.diff(starts) <= 0).any() or int(starts[-1]) >= count:
            raise DataError(f"{path}: the document table is not 0, strictly ascending, below {count}")
    prompts = None
    if n_docs and flags & FLAG_PROMPTS:
        prompts = np.frombuffer(raw, dtype="<u8", offset=header + count * token_bytes + 8 * n_docs,
                                count=n_docs).astype(np.uint64)
        lengths = np.diff(np.append(starts, count))
        if (prompts > lengths.astype(np.uint64)).any():
            raise DataError(f"{path}: a prompt is longer than its document")
        prompts = prompts.astype(np.int64)
    return tokens, int(vocab), starts, prompts


def write_token_file(path: str, tokens: np.ndarray, vocab_size: int, kind: int = KIND_BYTE,
                     digest: bytes = bytes(8), starts: np.ndarray | None = None,
                     prompts: np.ndarray | None = None) -> None:
    """A version-2 token file, or version 3 with the document |starts| (and
    the prompt lengths |prompts|, flagged); |digest| is the tokenizer hash
    (KIND_BPE only)."""
    tokens = np.asarray(tokens)
    token_bytes = 2 if vocab_size <= 1 << 16 else 4
    dtype = np.dtype("<u2" if token_bytes == 2 else "<u4")
    n_docs = 0 if starts is None else len(starts)
    flags = FLAG_PROMPTS if n_docs and prompts is not None else 0
    with open(path, "wb") as f:
        f.write(HEADER_V2.pack(MAGIC, VERSION_DOCS if n_docs else 2, vocab_size, token_bytes, kind | flags << 16,
                               len(tokens), digest, struct.pack("<Q", n_docs)))
        f.write(tokens.astype(dtype).tobytes())
        if n_docs:
            f.write(np.asarray(starts, dtype="<u8").tobytes())
        if flags:
            f.write(np.asarray(prompts, dtype="<u8").tobytes())


def synthetic_tokens(vocab_size: int, n: int = 65536) -> np.ndarray:
    """data.synthetic=true: t[i] = (i % 97 + 3 * ((i / 97) % 13)) % vocab_size."""
    i = np.arange(n, dtype=np.int64)
    return (i % 97 + 3 * ((i // 97) % 13)) % vocab_size


def split(tokens: np.ndarray, val_fraction: float, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val): the last floor(N * f) tokens are validation."""
    n = len(tokens)
    n_val = int(math.floor(float(n) * val_fraction))
    train, val = tokens[: n - n_val], tokens[n - n_val:]
    for name, part in (("training", train), ("validation", val)):
        if len(part) < seq_len + 1:
            raise DataError(f"{name} split has {len(part)} tokens, needs >= seq_len + 1 = {seq_len + 1}")
    return train, val


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def window_start(seed: int, stream: int, index: int, n_tokens: int, seq_len: int) -> int:
    """Start of sequence `index` of `stream` over a split of n_tokens tokens."""
    s = (seed & MASK64) ^ ((stream << 32) & MASK64)
    return splitmix64(splitmix64(s) ^ (index & MASK64)) % (n_tokens - seq_len)


@dataclass(frozen=True)
class Batch:
    """Arrays shaped [n_micro, mb, T]: tokens/targets/positions int32, mask
    (the loss weights) float32."""
    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    positions: np.ndarray | None = None


def sequences(split_tokens: np.ndarray, seed: int, stream: int, first_index: int, count: int,
              seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each int32 [count, T], for indices first_index.. of a stream."""
    n = len(split_tokens)
    starts = [window_start(seed, stream, first_index + j, n, seq_len) for j in range(count)]
    seqs = np.stack([split_tokens[s: s + seq_len + 1] for s in starts])
    return seqs[:, :-1].astype(np.int32), seqs[:, 1:].astype(np.int32)


@dataclass
class Source:
    """A corpus of documents: tokens, document starts and (optionally) each
    document's prompt length (a version-3 token file; read_token_file_prompts)."""
    tokens: np.ndarray
    starts: np.ndarray
    weight: float = 1.0
    prompts: np.ndarray | None = None


class DocStream:
    """The document stream of one split (docs/data.md, "Document stream")
    and sequences packed from it (packing none/pack), as src/data/packing.c.
    Sequential: sequence(i) for an i before the next one replays from 0."""

    def __init__(self, sources: list[tuple[np.ndarray, list[tuple[int, int]]]], weights: list[float], seed: int,
                 stream: int, seq_len: int, pack: bool) -> None:
        # sources: per source (tokens, the split's documents as (start, end, prompt length) in tokens).
        self.sources, self.seq_len, self.pack = sources, seq_len, pack
        total = 0.0
        for w in weights:
            total += w
        run, self.cum = 0.0, []
        for w in weights:
            run += w
            self.cum.append(run / total)
        self.base = splitmix64((seed & MASK64) ^ ((stream << 32) & MASK64))
        self.reset()

    def reset(self) -> None:
        self.next, self.draws = 0, 0
        self.drawn = [0] * len(self.sources)
        self.pending = None  # (source, document, pairs placed)

    def _draw(self) -> tuple[int, int]:
        u = (splitmix64(splitmix64((self.base + 1) & MASK64) ^ self.draws) >> 11) * 2.0 ** -53
        s = len(self.sources) - 1
        for i, c in enumerate(self.cum):
            if u < c:
                s = i
                break
        c = self.drawn[s]
        self.drawn[s] += 1
        self.draws += 1
        d = splitmix64(splitmix64((self.base + 2 + s) & MASK64) ^ c) % len(self.sources[s][1])
        return s, d

    def _pairs(self, s: int, d: int) -> int:
        a, b, _ = self.sources[s][1][d]
        return max(b - a - 1, 0)

    def _place(self, row, s: int, d: int, off: int, at: int, n: int) -> None:
        start, _, prompt = self.sources[s][1][d]
        a = start + off
        t = self.sources[s][0]
        row[0][at: at + n] = t[a: a + n]
        row[1][at: at + n] = t[a + 1: a + n + 1]
        # Pair i predicts token i + 1: 0 while that target is in the prompt.
        row[2][at: at + n] = np.where(off + np.arange(n) + 1 < prompt, 0.0, 1.0)
        row[3][at: at + n] = np.arange(n)

    def make(self):
        """The next sequence: (inputs, targets, weights, positions), each [T]."""
        T = self.seq_len
        row = (np.zeros(T, np.int32), np.zeros(T, np.int32), np.zeros(T, np.float32), np.zeros(T, np.int32))
        p = 0
        if self.pending is not None:
            s, d, off = self.pending
            n = min(T, self._pairs(s, d) - off)
            self._place(row, s, d, off, 0, n)
            self.pending = (s, d, off + n) if off + n < self._pairs(s, d) else None
            p = n
        while p < T and (self.pack or p == 0):
            s, d = self._draw()
            n = self._pairs(s, d)
            if n == 0:
                continue
            if n <= T - p:
                self._place(row, s, d, 0, p, n)
                p += n
                continue
            if not self.pack or n > T:
                self._place(row, s, d, 0, p, T - p)
                self.pending = (s, d, T - p)
                p = T
                break
            self.pending = (s, d, 0)
            break
        row[3][p:] = np.arange(T - p)  # padding: one more segment, weight 0
        self.next += 1
        return row

    def sequences(self, first: int, count: int):
        if first < self.next:
            self.reset()
        while self.next < first:
            self.make()
        rows = [self.make() for _ in range(count)]
        return tuple(np.stack([r[k] for r in rows]) for k in range(4))


def doc_split(tokens: np.ndarray, starts: np.ndarray, val_fraction: float, name: str = "source",
              prompts: np.ndarray | None = None):
    """(train, validation) documents as (start, end, prompt length)
    triples: the last floor(n_docs * f) documents are validation; each split
    holds a document of at least 2 tokens."""
    ends = list(starts[1:]) + [len(tokens)]
    pl = [0] * len(starts) if prompts is None else [int(p) for p in prompts]
    docs = [(int(a), int(b), p) for a, b, p in zip(starts, ends, pl)]
    n_val = int(math.floor(float(len(docs)) * val_fraction))
    train, val = docs[: len(docs) - n_val], docs[len(docs) - n_val:]
    for part in (train, val):
        if not any(b - a >= 2 for a, b, _ in part):
            raise DataError(f"{name} has {len(docs)} documents: too few for a training and a validation split")
    return train, val


class Sampler:
    """Training and evaluation batches of docs/data.md for one run.

    packing "concat" (the default) samples windows of |tokens|; "none" and
    "pack" draw documents from |sources| (Source objects; default: |tokens|
    with document |starts| and prompt lengths |prompts|) by weight."""

    def __init__(self, tokens: np.ndarray | None, *, seed: int, val_fraction: float, seq_len: int,
                 batch_size: int, microbatches: int, packing: str = "concat", starts: np.ndarray | None = None,
                 sources: list[Source] | None = None, prompts: np.ndarray | None = None) -> None:
        if batch_size % microbatches:
            raise ValueError("train.batch_size must be a multiple of train.microbatches")
        if packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}")
        self.packing = packing
        self.seed, self.seq_len = seed, seq_len
        self.batch_size, self.microbatches = batch_size, microbatches
        if packing == "concat":
            self.train, self.val = split(tokens, val_fraction, seq_len)
            return
        if sources is None:
            if starts is None:
                raise DataError("packing none/pack needs a version-3 token file (document starts)")
            sources = [Source(tokens, starts, prompts=prompts)]
        splits = [doc_split(src.tokens, src.starts, val_fraction, f"source {i}", src.prompts)
                  for i, src in enumerate(sources)]
        weights = [float(src.weight) for src in sources]
        self.streams = [DocStream([(src.tokens, sp[k]) for src, sp in zip(sources, splits)], weights, seed, k,
                                  seq_len, packing == "pack") for k in (TRAIN_STREAM, EVAL_STREAM)]

    def _make(self, split_tokens: np.ndarray | None, stream: int, first: int, count: int) -> Batch:
        shape = (count // (self.batch_size // self.microbatches), self.batch_size // self.microbatches,
                 self.seq_len)
        if self.packing == "concat":
            x, y = sequences(split_tokens, self.seed, stream, first, count, self.seq_len)
            pos = np.broadcast_to(np.arange(self.seq_len, dtype=np.int32), shape).copy()
            return Batch(x.reshape(shape), y.reshape(shape), np.ones(shape, np.float32), pos)
        x, y, w, pos = self.streams[stream].sequences(first, count)
        return Batch(x.reshape(shape), y.reshape(shape), w.reshape(shape), pos.reshape(shape))

    def fill(self, stream: int, first: int, count: int) -> tuple[np.ndarray, ...]:
        """st_dataset_fill: (inputs, targets, weights, positions), each [count, T]."""
        if self.packing == "concat":
            x, y = sequences(self.train if stream == TRAIN_STREAM else self.val, self.seed, stream, first, count,
                             self.seq_len)
            return (x, y, np.ones(x.shape, np.float32),
                    np.broadcast_to(np.arange(self.seq_len, dtype=np.int32), x.shape).copy())
        return self.streams[stream].sequences(first, count)

    def batch(self, step: int) -> Batch:
        """Training batch of step `step` (0-based): indices step*B .. step*B + B - 1."""
        B = self.batch_size
        return self._make(getattr(self, "train", None), TRAIN_STREAM, step * B, B)

    def eval_batch(self, eval_batches: int) -> Batch:
        """The fixed evaluation set: indices 0 .. eval_batches*B - 1 of stream 1."""
        return self._make(getattr(self, "val", None), EVAL_STREAM, 0, eval_batches * self.batch_size)
