"""The BPE tokenizer (docs/data.md, "Tokenizer"; issue 13 item 5).

data.tokenizer=bpe trains a byte-level BPE vocabulary of data.vocab_size on
the corpus with Hugging Face tokenizers (python -m strata_jax.tokenize, run
by strata at data-preparation time). Checked here on a corpus of two
fortunes files plus text with non-ASCII characters and bytes that are not
UTF-8:

- a short training run: the token file's version-2 header records the hash
  of the tokenizer.json beside it (the first 8 bytes of its SHA-256); the
  run directory holds the same tokenizer.json; every checkpoint manifest and
  context.json carry the hash;
- resuming with another tokenizer (another data.vocab_size, or the byte
  tokenizer) exits 3 naming both hashes, and leaves the run's
  tokenizer.json alone;
- a vocabulary too small for the 256 byte symbols, or larger than the
  model's, exits 2 naming data.vocab_size;
- a token file given as data.path whose tokenizer.json does not match its
  header, or whose tokenizer is not the configured one, exits 3;
- C decoding (strata data --decode) equals tokenizers' decode: the whole
  token file decodes to the corpus bytes exactly (the bytes that are not
  UTF-8 included, which tokenizers can only show as U+FFFD), and random
  windows and random id sequences agree with tokenizers (lossy where the
  bytes are not UTF-8);
- strata sample decodes a BPE run's ids through its tokenizer.json;
- strata eval's bits per byte divide by the validation split's bytes per
  token (decoded lengths), not by 1; on another corpus it applies the run's
  tokenizer instead of training a new one;
- training is deterministic: the same corpus gives the same tokenizer.json
  bytes in fresh processes with different hash seeds;
- the Python reference reader reads the version-2 file to the same tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.path.join(ROOT, "build", "strata")
sys.path.insert(0, os.path.join(ROOT, "python"))
from strata_jax import data as D  # noqa: E402

FORTUNES = "/usr/share/games/fortunes"
VOCAB = 512


def run(cmd: list[str], ok: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=300, **kw)
    if ok and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout[-2000:]!r}\n"
                             f"stderr:\n{r.stderr.decode(errors='replace')}")
    return r


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("corpus")
    data = b"".join(open(os.path.join(FORTUNES, n), "rb").read() for n in ("art", "computers"))
    data += "Naïve café, smörgåsbord, 東京, emoji 🙂.\n".encode() * 20
    data += b"latin-1 bytes \xe9t\xe9 and a stray \xff\xfe here\n"  # not UTF-8: byte tokens
    p = d / "corpus.txt"
    p.write_bytes(data)
    return str(p)


def data_args(corpus: str, *extra: str) -> list[str]:
    return ["configs/test.yml", "data.synthetic=false", f"data.path={corpus}", "data.tokenizer=bpe",
            f"model.vocab_size={VOCAB}", *extra]


def token_file(corpus: str, *extra: str) -> str:
    return run([STRATA, "data", *data_args(corpus, *extra)]).stdout.decode().splitlines()[0]


def header(path: str) -> tuple:
    with open(path, "rb") as f:
        return D.HEADER_V2.unpack(f.read(D.HEADER_V2.size))


def sha16(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def tokenizer_json(tok: str) -> str:
    return tok[: -len(".tok")] + ".tokenizer.json"


def test_token_file_header_records_the_tokenizer(corpus):
    tok = token_file(corpus)
    magic, version, vocab, token_bytes, kind, count, digest, reserved = header(tok)
    assert (magic, version, vocab, token_bytes, kind, reserved) == (D.MAGIC, 2, VOCAB, 2, D.KIND_BPE, bytes(8))
    js = tokenizer_json(tok)
    with open(js, "rb") as f:
        assert digest == hashlib.sha256(f.read()).digest()[:8]
    assert os.path.getsize(tok) == D.HEADER_V2.size + 2 * count
    # `strata data` names the tokenizer; the reference reader reads the same tokens.
    out = run([STRATA, "data", *data_args(corpus)]).stdout.decode().splitlines()
    assert out[2] == f"tokenizer {sha16(js)}"
    ids, v = D.read_token_file(tok)
    assert v == VOCAB and len(ids) == count and D.token_file_tokenizer(tok) == sha16(js)
    t = Tokenizer.from_file(js)
    assert t.get_vocab_size() == VOCAB
    # BPE merged something: fewer tokens than bytes.
    assert count < 0.7 * os.path.getsize(corpus)


def test_training_is_deterministic(corpus, tmp_path):
    hashes = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.path.join(ROOT, "python")}
        out = tmp_path / f"t{seed}"
        run([sys.executable, "-m", "strata_jax.tokenize", "--vocab-size", str(VOCAB), "--out", f"{out}.tok",
             "--tokenizer-out", f"{out}.json", "--", corpus], env=env)
        hashes.add((sha16(f"{out}.json"), sha16(f"{out}.tok")))
    assert len(hashes) == 1
    # ... and it is the tokenizer strata made for the same corpus and size.
    assert sha16(tokenizer_json(token_file(corpus))) == hashes.pop()[0]


def test_run_records_the_tokenizer_and_resume_refuses_another(corpus, tmp_path):
    rd = tmp_path / "run"
    args = [STRATA, "train", *data_args(corpus), "train.steps=4", "train.eval_every=2", "ckpt.every=2",
            "ckpt.async=false", "run.progress=off", f"run.dir={rd}"]
    run(args)
    js = tokenizer_json(token_file(corpus))
    h = sha16(js)
    with open(js, "rb") as a, open(rd / "tokenizer.json", "rb") as b:
        assert a.read() == b.read()
    assert json.loads((rd / "context.json").read_text())["tokenizer_hash"] == h
    manifests = sorted((rd / "checkpoints").glob("step_*/manifest.json"))
    assert len(manifests) == 2
    for m in manifests:
        assert json.loads(m.read_text())["tokenizer_hash"] == h
    inspect = run([STRATA, "ckpt", "inspect", str(manifests[-1].parent)]).stdout.decode()
    assert f"  tokenizer       {h}\n" in inspect
    # Bits per byte divide by the validation split's bytes per token (not 1 as for bytes).
    ev = json.loads(run([STRATA, "eval", str(rd), "--json"]).stdout)
    ids, _ = D.read_token_file(tokenizer_json(token_file(corpus))[: -len(".tokenizer.json")] + ".tok")
    _, val = D.split(ids, 0.05, 16)
    t = Tokenizer.from_file(js)
    per_token = sum(len(bytes_of(t, int(i))) for i in val) / len(val)
    assert per_token > 1.5
    assert ev["bits_per_byte"] == pytest.approx(ev["loss"] / math.log(2) / per_token, rel=1e-12)

    # On another corpus, strata eval applies the run's tokenizer (never trains
    # a new vocabulary), and refuses a token file of another tokenizer.
    other = tmp_path / "other.txt"
    other.write_bytes(open(os.path.join(FORTUNES, "science"), "rb").read()[:60000])
    ev2 = json.loads(run([STRATA, "eval", str(rd), f"data.path={other}", "--json"]).stdout)
    assert ev2["token_file"] != ev["token_file"] and D.token_file_tokenizer(ev2["token_file"]) == h
    with open(tokenizer_json(ev2["token_file"]), "rb") as a, open(js, "rb") as b:
        assert a.read() == b.read()
    tok400 = token_file(corpus, "data.vocab_size=400")
    r = run([STRATA, "eval", str(rd), f"data.path={tok400}"], ok=False)
    assert r.returncode == 3 and h in r.stderr.decode() and sha16(tokenizer_json(tok400)) in r.stderr.decode()

    # strata sample decodes through the run's tokenizer.json: a prompt of ids
    # is echoed as its bytes, the default start is the newline token, a text
    # prompt is refused (strata encodes no text in C), no tokenizer.json is exit 3.
    prompt = [t.token_to_id("Ġthe"), t.token_to_id("Ċ"), 300, 511]
    out = run([STRATA, "sample", str(rd), "--tokens", "8", "--temperature", "0",
               "--prompt", " ".join(map(str, prompt))]).stdout
    assert out.startswith(b"".join(bytes_of(t, i) for i in prompt)) and len(out) > len(b" the\n") + 8
    assert run([STRATA, "sample", str(rd), "--tokens", "4", "--seed", "1"]).stdout.startswith(b"\n")
    r = run([STRATA, "sample", str(rd), "--prompt", "hello"], ok=False)
    assert r.returncode == 2 and "BPE" in r.stderr.decode()
    os.rename(rd / "tokenizer.json", rd / "t.json")
    r = run([STRATA, "sample", str(rd), "--tokens", "4"], ok=False)
    assert r.returncode == 3 and "tokenizer.json is missing" in r.stderr.decode()
    os.rename(rd / "t.json", rd / "tokenizer.json")

    # Another vocabulary size is another tokenizer: an identity mismatch, exit 7 naming both.
    config_before = (rd / "config.yaml").read_bytes()
    other = run([*args, "train.steps=6", "run.resume=true", "data.vocab_size=400"], ok=False)
    err = other.stderr.decode()
    h400 = sha16(tokenizer_json(token_file(corpus, "data.vocab_size=400")))
    assert other.returncode == 7 and "identity mismatch: tokenizer" in err, err
    assert h in err and h400 in err and h != h400
    # The byte tokenizer (the model's vocabulary unchanged): exit 7 too.
    byte = run([*args[:2], "configs/test.yml", "data.synthetic=false", f"data.path={corpus}",
                f"model.vocab_size={VOCAB}", "train.steps=6", "ckpt.every=2", "ckpt.async=false", "run.progress=off",
                f"run.dir={rd}", "run.resume=true"], ok=False)
    assert byte.returncode == 7 and f'tokenizer "{h}" in the checkpoint, "byte" given' in byte.stderr.decode()
    # Neither refusal replaced the run's tokenizer or its config.yaml, and the same one resumes.
    assert sha16(rd / "tokenizer.json") == h
    assert (rd / "config.yaml").read_bytes() == config_before
    run([*args, "train.steps=6", "run.resume=true"])
    assert json.loads((rd / "checkpoints" / "step_6" / "manifest.json").read_text())["tokenizer_hash"] == h


@pytest.mark.parametrize("over,needle", [
    (["data.vocab_size=255"], "data.vocab_size (255"),
    (["model.vocab_size=200"], "data.vocab_size (200"),  # 0: model.vocab_size, too small
    ([f"data.vocab_size={VOCAB * 2}"], f"data.vocab_size ({VOCAB * 2}"),  # above model.vocab_size
    (["data.vocab_size=70000"], "data.vocab_size"),  # above u16
    (["data.tokenizer=byte", "data.vocab_size=300"], "data.vocab_size (300"),
])
def test_bad_vocabulary_is_a_config_error(corpus, over, needle):
    r = run([STRATA, "data", *data_args(corpus), *over], ok=False)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr.decode()


def test_token_file_of_another_tokenizer_is_a_data_error(corpus, tmp_path):
    tok = token_file(corpus)
    h = sha16(tokenizer_json(tok))
    mine = tmp_path / "mine.tok"
    shutil.copy(tok, mine)
    # Given directly: found beside it, checked, accepted.
    shutil.copy(tokenizer_json(tok), tmp_path / "mine.tokenizer.json")
    assert run([STRATA, "data", *data_args(str(mine))]).stdout.decode().splitlines()[2] == f"tokenizer {h}"
    # Another tokenizer.json beside it: exit 3 naming both hashes.
    shutil.copy(tokenizer_json(token_file(corpus, "data.vocab_size=400")), tmp_path / "mine.tokenizer.json")
    r = run([STRATA, "data", *data_args(str(mine))], ok=False)
    assert r.returncode == 3 and h in r.stderr.decode() and sha16(tmp_path / "mine.tokenizer.json") in r.stderr.decode()
    # A header that claims more tokens than its tokenizer.json has: exit 3.
    ids, _ = D.read_token_file(tok)
    ids[5] = 599
    big = tmp_path / "big.tok"
    D.write_token_file(str(big), ids, 600, D.KIND_BPE, header(tok)[6])
    shutil.copy(tokenizer_json(tok), tmp_path / "big.tokenizer.json")
    r = run([STRATA, "data", *data_args(str(big), "model.vocab_size=1024", "data.vocab_size=600")], ok=False)
    assert r.returncode == 3 and f"token 5 is 599, outside its tokenizer's {VOCAB} entries" in r.stderr.decode()
    # None beside it: exit 3.
    os.remove(tmp_path / "mine.tokenizer.json")
    r = run([STRATA, "data", *data_args(str(mine))], ok=False)
    assert r.returncode == 3 and "mine.tokenizer.json" in r.stderr.decode()
    # A BPE file under the byte tokenizer, and a byte file under bpe: exit 3.
    r = run([STRATA, "data", "configs/test.yml", "data.synthetic=false", f"data.path={tok}",
             f"model.vocab_size={VOCAB}"], ok=False)
    assert r.returncode == 3 and h in r.stderr.decode()
    byte_tok = run([STRATA, "data", "configs/test.yml", "data.synthetic=false",
                    f"data.path={corpus}"]).stdout.decode().splitlines()[0]
    assert header(byte_tok)[1:5] == (2, 256, 2, D.KIND_BYTE)
    r = run([STRATA, "data", *data_args(byte_tok)], ok=False)
    assert r.returncode == 3 and "data.tokenizer is bpe" in r.stderr.decode()
    # A version-1 file still reads, as the byte tokenizer's.
    ids, _ = D.read_token_file(byte_tok)
    v1 = tmp_path / "old.tok"
    v1.write_bytes(D.HEADER.pack(D.MAGIC, 1, 256, 2, 0, len(ids)) + ids.astype("<u2").tobytes())
    out = run([STRATA, "data", "configs/test.yml", "data.synthetic=false", f"data.path={v1}"]).stdout.decode()
    assert out.splitlines()[2] == "tokenizer byte"
    assert D.token_file_tokenizer(str(v1)) == "byte" and (D.read_token_file(str(v1))[0] == ids).all()


def decode_c(corpus: str, ids, *extra: str) -> bytes:
    text = " ".join(str(int(i)) for i in ids)
    return run([STRATA, "data", *data_args(corpus, *extra), "--decode", "-"], input=text.encode()).stdout


def test_c_decode_equals_tokenizers(corpus):
    tok = token_file(corpus)
    t = Tokenizer.from_file(tokenizer_json(tok))
    ids, _ = D.read_token_file(tok)
    raw = open(corpus, "rb").read()
    # The whole file: exactly the corpus, bytes that are not UTF-8 included.
    whole = decode_c(corpus, ids)
    assert whole == raw
    assert t.decode(ids.tolist()) == raw.decode("utf-8", errors="replace")
    # Windows of the token file and random ids, in one call each way: the
    # sequences are joined with a separator token (a newline byte's id).
    r = random.Random(13)
    nl = t.token_to_id("Ċ")  # GPT-2's symbol for b"\n"
    seqs = []
    for _ in range(60):
        n = r.randrange(1, 200)
        s = r.randrange(0, len(ids) - n)
        seqs.append(ids[s: s + n].tolist())
    seqs += [[r.randrange(VOCAB) for _ in range(r.randrange(1, 50))] for _ in range(60)]
    for seq in seqs[:3] + seqs[60:63]:  # a few on their own, exactly
        assert decode_c(corpus, seq).decode("utf-8", errors="replace") == t.decode(seq)
    joined = []
    for seq in seqs:
        joined += seq + [nl]
    out = decode_c(corpus, joined)
    parts = [b"".join(bytes_of(t, i) for i in seq) for seq in seqs]
    assert out == b"".join(p + b"\n" for p in parts)
    for seq, p in zip(seqs, parts):
        assert p.decode("utf-8", errors="replace") == t.decode(seq)


def bytes_of(t: Tokenizer, i: int) -> bytes:
    """One id's bytes per tokenizers itself, where they are UTF-8; else through
    the GPT-2 map of strata_jax.tokenize (the C side has its own inverse)."""
    from strata_jax.tokenize import bytes_to_unicode
    inv = {c: b for b, c in bytes_to_unicode().items()}
    return bytes(inv[c] for c in t.id_to_token(i))


def test_c_decode_refuses_ids_outside_the_vocabulary(corpus):
    r = run([STRATA, "data", *data_args(corpus, f"model.vocab_size={VOCAB + 64}", f"data.vocab_size={VOCAB}"),
             "--decode", f"1,{VOCAB}"], ok=False)
    assert r.returncode == 3 and f"is {VOCAB}, outside tokenizer" in r.stderr.decode()


def test_byte_tokenizer_decodes_bytes(corpus):
    out = run([STRATA, "data", "configs/test.yml", "data.synthetic=false", f"data.path={corpus}",
               "--decode", "72,105,0,255,10"]).stdout
    assert out == b"Hi\x00\xff\n"


def test_corpus_too_small_for_the_vocabulary_is_a_data_error(tmp_path):
    small = tmp_path / "small.txt"
    small.write_bytes(b"tiny corpus text, hello world\n" * 40)
    r = run([STRATA, "data", *data_args(str(small), "model.vocab_size=2048")], ok=False)
    assert r.returncode == 3 and "fewer than data.vocab_size=2048" in r.stderr.decode()
