"""The golden cases: every preset in configs/ at a test-sized shape
(tests/golden/README.md, "Cases"). Each case is a preset and the overrides
that shrink it; the shapes are chosen so that most cases load a bundle another
make-test test exports anyway (the expensive part of a run is the export and
compile of a new shape, not its 20 steps), and the comment of each says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Every case: 20 steps, no evaluation but the final one, no tensorboard, the
# per-layer statistics of diag.numerics=layer (parameters stay bitwise those
# of diag.numerics=off: tests/py/test_numerics.py).
STEPS = 20
COMMON = [f"train.steps={STEPS}", "train.eval_every=0", "train.eval_batches=1", "ckpt.every=0",
          "obs.tensorboard=false", "run.progress=off", "diag.numerics=layer"]

XLA = ["kernels.rmsnorm=xla", "kernels.swiglu=xla", "kernels.cross_entropy=xla", "kernels.attention=xla"]
# configs/test.yml's model and batch: the bundle most of the suite trains.
TEST_SHAPE = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.d_ff=64", "model.seq_len=16",
              "train.batch_size=4", "train.microbatches=2"]
# tests/py/test_kinds.py's and test_moe_equivalence.py's SHORT: the presets at
# their own width and depth, sequence 16, batch 2 (those tests train them in
# make test with synthetic data; here with the preset's own corpus).
PRESET_SHORT = ["model.seq_len=16", "train.batch_size=2", "model.vocab_size=256"]


@dataclass(frozen=True)
class Case:
    name: str
    config: str
    overrides: list[str] = field(default_factory=list)
    # in make test (False: make test-long only)
    quick: bool = True
    why: str = ""


CASES: list[Case] = [
    Case("test", "configs/test.yml", [],
         why="configs/test.yml as it is (synthetic data, xla kernels): the suite's shared bundle"),
    Case("base", "configs/base.yml", TEST_SHAPE + XLA,
         why="base.yml's optimizer settings and corpus (fortunes) on test.yml's bundle"),
    Case("small", "configs/small.yml", TEST_SHAPE + XLA,
         why="small.yml's settings and corpus on test.yml's bundle"),
    Case("tiny-bf16", "configs/tiny.yml", XLA + ["model.n_layers=2", "model.compute_dtype=bf16"],
         why="tiny.yml at its width in bf16, 2 layers: test_mixed_precision.py's bf16 bundle"),
    Case("llama-tiny-gqa", "configs/llama-tiny-gqa.yml", PRESET_SHORT,
         why="grouped-query llama at the preset's width, kernels auto (ffi): test_kinds.py's preset bundle"),
    Case("moe-tiny", "configs/moe-tiny.yml", PRESET_SHORT,
         why="llama and moe layers, kernels auto (ffi): test_moe_equivalence.py's preset bundle"),
    Case("llama-mix-tiny", "configs/llama-mix-tiny.yml", PRESET_SHORT,
         why="llama and parallel layers, kernels auto (ffi): a bundle of its own"),
    # gpt2 in make test on tests/py/test_gpt2.py's equivalence bundle (its
    # model, xla kernels, synthetic tokens: a vocabulary of 250 is below the
    # byte tokenizer's 256); the preset's own data path, a BPE vocabulary
    # trained on the corpus, with the C kernels, in make test-long (its
    # export and the tokenizer's training: ~20 s on the loaded 2-core VM).
    Case("gpt2-124m", "configs/gpt2-124m.yml",
         XLA + ["model.n_layers=2", "model.d_model=32", "model.n_heads=4", "model.d_ff=64", "model.seq_len=16",
                "model.vocab_size=250", "model.vocab_padded=320", "train.batch_size=4", "train.microbatches=2",
                "data.tokenizer=byte", "data.synthetic=true"],
         why="gpt2 blocks, vocabulary 250 padded to 320, synthetic tokens, xla: test_gpt2.py's bundle"),
    Case("gpt2-124m-bpe", "configs/gpt2-124m.yml",
         ["model.n_layers=2", "model.d_model=32", "model.n_heads=4", "model.d_ff=64", "model.seq_len=16",
          "model.vocab_size=320", "model.vocab_padded=384", "train.batch_size=4", "train.microbatches=2"],
         quick=False,
         why="gpt2 blocks on the preset's corpus with a BPE vocabulary (320, trained on it) padded to 384, "
             "kernels auto (ffi): a bundle of its own"),
]

BY_NAME = {c.name: c for c in CASES}
