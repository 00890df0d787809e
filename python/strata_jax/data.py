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
    if magic != MAGIC or version not in (1, 2):
        raise DataError(f"{path}: not a token file")
    if version == 1:
        return "byte"
    kind, digest = HEADER_V2.unpack_from(raw)[4], HEADER_V2.unpack_from(raw)[6]
    return {KIND_NONE: "none", KIND_BYTE: "byte"}.get(kind, digest.hex())


def read_token_file(path: str) -> tuple[np.ndarray, int]:
    """Returns (tokens as int64 array, vocab_size); validates the whole file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < HEADER.size:
        raise DataError(f"{path}: too short for a token file header")
    magic, version, vocab, token_bytes, kind, count = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise DataError(f"{path}: bad magic {magic!r}")
    if version not in (1, 2):
        raise DataError(f"{path}: unsupported version {version}")
    header = HEADER.size if version == 1 else HEADER_V2.size
    if len(raw) < header:
        raise DataError(f"{path}: too short for a version-{version} token file header")
    if version == 2 and kind not in (KIND_NONE, KIND_BYTE, KIND_BPE):
        raise DataError(f"{path}: unknown tokenizer kind {kind}")
    if token_bytes not in (2, 4):
        raise DataError(f"{path}: token_bytes must be 2 or 4, got {token_bytes}")
    if len(raw) != header + count * token_bytes:
        raise DataError(f"{path}: size {len(raw)} != {header} + {count} * {token_bytes}")
    dtype = np.dtype("<u2" if token_bytes == 2 else "<u4")
    tokens = np.frombuffer(raw, dtype=dtype, offset=header, count=count).astype(np.int64)
    if count and int(tokens.max()) >= vocab:
        raise DataError(f"{path}: token {int(tokens.max())} >= vocab_size {vocab}")
    return tokens, int(vocab)


def write_token_file(path: str, tokens: np.ndarray, vocab_size: int, kind: int = KIND_BYTE,
                     digest: bytes = bytes(8)) -> None:
    """A version-2 token file; |digest| is the tokenizer hash (KIND_BPE only)."""
    tokens = np.asarray(tokens)
    token_bytes = 2 if vocab_size <= 1 << 16 else 4
    dtype = np.dtype("<u2" if token_bytes == 2 else "<u4")
    with open(path, "wb") as f:
        f.write(HEADER_V2.pack(MAGIC, 2, vocab_size, token_bytes, kind, len(tokens), digest, bytes(8)))
        f.write(tokens.astype(dtype).tobytes())


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
    """Arrays shaped [n_micro, mb, T]: tokens/targets int32, mask float32."""
    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray


def sequences(split_tokens: np.ndarray, seed: int, stream: int, first_index: int, count: int,
              seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each int32 [count, T], for indices first_index.. of a stream."""
    n = len(split_tokens)
    starts = [window_start(seed, stream, first_index + j, n, seq_len) for j in range(count)]
    seqs = np.stack([split_tokens[s: s + seq_len + 1] for s in starts])
    return seqs[:, :-1].astype(np.int32), seqs[:, 1:].astype(np.int32)


class Sampler:
    """Training and evaluation batches of docs/data.md for one run."""

    def __init__(self, tokens: np.ndarray, *, seed: int, val_fraction: float, seq_len: int,
                 batch_size: int, microbatches: int) -> None:
        if batch_size % microbatches:
            raise ValueError("train.batch_size must be a multiple of train.microbatches")
        self.train, self.val = split(tokens, val_fraction, seq_len)
        self.seed, self.seq_len = seed, seq_len
        self.batch_size, self.microbatches = batch_size, microbatches

    def _make(self, split_tokens: np.ndarray, stream: int, first: int, count: int) -> Batch:
        x, y = sequences(split_tokens, self.seed, stream, first, count, self.seq_len)
        shape = (count // (self.batch_size // self.microbatches), self.batch_size // self.microbatches,
                 self.seq_len)
        return Batch(x.reshape(shape), y.reshape(shape), np.ones(shape, np.float32))

    def batch(self, step: int) -> Batch:
        """Training batch of step `step` (0-based): indices step*B .. step*B + B - 1."""
        B = self.batch_size
        return self._make(self.train, TRAIN_STREAM, step * B, B)

    def eval_batch(self, eval_batches: int) -> Batch:
        """The fixed evaluation set: indices 0 .. eval_batches*B - 1 of stream 1."""
        return self._make(self.val, EVAL_STREAM, 0, eval_batches * self.batch_size)
