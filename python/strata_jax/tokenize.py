"""Trains a byte-level BPE tokenizer on a corpus and writes its token file.

    python -m strata_jax.tokenize --vocab-size N --out TOKENS.tok \\
        --tokenizer-out TOKENIZER.json [--tokenizer-in TRAINED.json] [--documents BYTES.tok] \\
        [--] CORPUS_FILE...

strata runs this at data-preparation time (data.tokenizer=bpe, src/data/
dataset.c), as it runs the exporter; docs/data.md is the specification:

- the corpus is the files' bytes concatenated in the order given, cut into
  lines (each keeps its '\\n'); a line is cut again around bytes that are not
  UTF-8, and each such byte is its own token (the byte alphabet holds all
  256, so nothing is ever unknown);
- the tokenizer is Hugging Face `tokenizers`' BPE with the ByteLevel
  pre-tokenizer (GPT-2's split and bytes-to-unicode mapping) and decoder,
  trained on those pieces with the 256 byte symbols as the initial alphabet
  and no special tokens, to exactly N tokens (a corpus too small for N is an
  error, exit 3);
- with --tokenizer-in, nothing is trained: that tokenizer (of N tokens) is
  applied to the corpus and copied byte for byte (`strata eval` of a BPE
  run on another corpus: the run's ids, not a new vocabulary's);
- with --documents BYTES.tok (data.packing none/pack), BYTES.tok is the
  byte tokenizer's version-3 file of the corpus's documents, as strata's C
  splitting made it (separator, jsonl, prompt marker: one rule, in C);
  training still sees the corpus, but each document is encoded on its own,
  its prompt (the first P bytes, P from the byte file's prompt table) and
  its completion apart, so no token spans two documents or a prompt's end;
  TOKENS.tok is then version 3 with the document table (and the prompt
  table, in tokens, when BYTES.tok has one);
- TOKENIZER.json is written first, then TOKENS.tok (version 2 header, or 3
  with documents; the tokenizer's hash: the first 8 bytes of SHA-256 of
  TOKENIZER.json), each atomically.

Exit codes: 0 ok, 2 bad arguments, 3 a corpus that cannot make the
tokenizer. Training is deterministic: the same corpus and N give the same
TOKENIZER.json bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

import numpy as np

from .data import HEADER_V2, KIND_BPE, MAGIC, DataError, read_token_file_prompts, write_token_file

MIN_VOCAB = 256  # the byte alphabet; no special tokens
MAX_VOCAB = 1 << 16  # strata keeps tokens as u16


def pieces(corpus: bytes) -> list[tuple[bool, bytes]]:
    """(is_text, bytes) pieces: lines, cut around bytes that are not UTF-8."""
    out: list[tuple[bool, bytes]] = []
    for line in _lines(corpus):
        rest = line
        while rest:
            try:
                rest.decode("utf-8")
                out.append((True, rest))
                break
            except UnicodeDecodeError as e:
                if e.start:
                    out.append((True, rest[: e.start]))
                out.extend((False, rest[i: i + 1]) for i in range(e.start, e.end))
                rest = rest[e.end:]
    return out


def _lines(corpus: bytes) -> list[bytes]:
    """Lines ending at '\\n' only (bytes.splitlines also cuts at '\\r')."""
    parts = corpus.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def train(corpus: bytes, vocab_size: int, trained: str | None = None):
    """The tokenizer trained on |corpus| (or loaded from |trained|), of
    exactly |vocab_size| tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if trained:
        tok = Tokenizer.from_file(trained)
        if tok.get_vocab_size() != vocab_size:
            raise CorpusError(f"{trained} has {tok.get_vocab_size()} tokens, not data.vocab_size={vocab_size}")
        return tok
    texts = [p.decode("utf-8") for is_text, p in pieces(corpus) if is_text]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=0, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    got = tok.get_vocab_size()
    if got != vocab_size:
        raise CorpusError(f"BPE on this corpus stops at {got} tokens, fewer than data.vocab_size={vocab_size}: "
                          "lower data.vocab_size or use a larger corpus")
    return tok


def encode(tok, texts: list[bytes]) -> list[np.ndarray]:
    """Each of |texts| encoded on its own (np.uint16 ids): cut into pieces
    (lines, then around bytes that are not UTF-8), each piece encoded on its
    own, a byte that is not UTF-8 as the token of its byte symbol."""
    symbols = bytes_to_unicode()
    byte_ids = [tok.token_to_id(symbols[b]) for b in range(256)]
    if any(i is None for i in byte_ids):
        raise CorpusError("the vocabulary lacks a byte symbol (tokenizers changed?)")
    split = [pieces(t) for t in texts]
    # One batch for all texts: encoding is per piece either way.
    encoded = iter(tok.encode_batch([p.decode("utf-8") for ps in split for is_text, p in ps if is_text],
                                    add_special_tokens=False))
    out = []
    for ps in split:
        ids: list[int] = []
        for is_text, p in ps:
            if is_text:
                ids.extend(next(encoded).ids)
            else:
                ids.append(byte_ids[p[0]])
        out.append(np.asarray(ids, dtype=np.uint16))
    return out


def encode_documents(tok, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(ids, document starts, prompt lengths or None) of the byte
    tokenizer's version-3 file |path|: each document's prompt and completion
    encoded apart, so the prompt's length in tokens is its own encoding's."""
    try:
        raw, _, starts, prompts = read_token_file_prompts(path)
    except DataError as e:
        raise CorpusError(f"the documents file: {e}") from e
    if starts is None:
        raise CorpusError(f"{path} holds no document table")
    data = raw.astype(np.uint8).tobytes()
    ends = list(starts[1:]) + [len(data)]
    parts = []
    for d, (a, b) in enumerate(zip(starts, ends)):
        p = int(prompts[d]) if prompts is not None else 0
        parts += [data[a: a + p], data[a + p: b]]
    enc = encode(tok, parts)
    lengths = [len(enc[2 * d]) + len(enc[2 * d + 1]) for d in range(len(starts))]
    out_starts = np.cumsum([0] + lengths[:-1]).astype(np.uint64)
    out_prompts = None if prompts is None else np.asarray([len(enc[2 * d]) for d in range(len(starts))], np.uint64)
    return np.concatenate(enc).astype(np.uint16), out_starts, out_prompts


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> symbol map: printable Latin-1 bytes stand for
    themselves, the other 68 take the code points 256, 257, ... in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


class CorpusError(Exception):
    pass


def tokenizer_hash(data: bytes) -> bytes:
    """The 8 bytes the token file records: SHA-256 of tokenizer.json, first 8."""
    return hashlib.sha256(data).digest()[:8]


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata_jax.tokenize", description=__doc__.strip().splitlines()[0])
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--out", required=True, help="the token file to write")
    ap.add_argument("--tokenizer-out", required=True, help="the tokenizer.json to write")
    ap.add_argument("--tokenizer-in", help="a trained tokenizer.json to apply (and copy) instead of training")
    ap.add_argument("--documents", help="the byte tokenizer's version-3 file of the corpus's documents: encode "
                    "each on its own and write version 3")
    ap.add_argument("corpus", nargs="+", help="corpus files, concatenated in this order")
    args = ap.parse_args(argv)
    if not MIN_VOCAB <= args.vocab_size <= MAX_VOCAB:
        print(f"strata_jax.tokenize: --vocab-size {args.vocab_size} is outside [{MIN_VOCAB}, {MAX_VOCAB}]",
              file=sys.stderr)
        return 2
    chunks = []
    for path in args.corpus:
        with open(path, "rb") as f:
            chunks.append(f.read())
    corpus = b"".join(chunks)
    if not corpus:
        print("strata_jax.tokenize: the corpus is empty", file=sys.stderr)
        return 3
    try:
        tok = train(corpus, args.vocab_size, args.tokenizer_in)
        starts = prompts = None
        if args.documents:
            ids, starts, prompts = encode_documents(tok, args.documents)
        else:
            ids = encode(tok, [corpus])[0]
    except CorpusError as e:
        print(f"strata_jax.tokenize: {e}", file=sys.stderr)
        return 3
    if args.tokenizer_in:
        with open(args.tokenizer_in, "rb") as f:
            text = f.read()  # the same bytes, so the same hash
    else:
        text = tok.to_str(pretty=False).encode("utf-8")
    _write_atomic(args.tokenizer_out, text)
    if starts is None:
        header = HEADER_V2.pack(MAGIC, 2, args.vocab_size, 2, KIND_BPE, len(ids), tokenizer_hash(text), b"\0" * 8)
        _write_atomic(args.out, header + ids.astype("<u2").tobytes())
    else:
        tmp = f"{args.out}.tmp-{os.getpid()}"
        write_token_file(tmp, ids, args.vocab_size, KIND_BPE, tokenizer_hash(text), starts, prompts)
        os.replace(tmp, args.out)
    print(f"strata_jax.tokenize: {len(corpus)} bytes -> {len(ids)} tokens"
          f"{'' if starts is None else f' in {len(starts)} documents'}, vocabulary {args.vocab_size}, "
          f"tokenizer {tokenizer_hash(text).hex()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
