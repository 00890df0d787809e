"""The configuration types of the front-end: ModelConfig and TrainConfig.

Plain data with the checks that need nothing else: this module imports no
other module of the package, so every module can import it. The checks of
a model config that need the registered block kinds or the kernel contract
(an unknown kind, kinds of two families in one stack, a kind's own checks,
an unknown kernel implementation) are added by registry.py (add_check),
which model.py imports: a config built after `import strata_jax.model` is
checked in full.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Mapping

import jax.numpy as jnp
import numpy as np

_MOE_DEFAULTS: dict[str, Any] = {"n_experts": 8, "moe_top_k": 2, "moe_aux_weight": 0.01, "moe_z_weight": 0.001}
_OPTIONAL: frozenset[str] = frozenset({"n_kv_heads", "block", "layers", "kernels", "vocab_padded", "packing",
                                        "optimizer", *_MOE_DEFAULTS})
PACKINGS: tuple[str, ...] = ("concat", "none", "pack")  # data.packing (docs/model.md, "Packing")


# Checks of a whole ModelConfig added by the modules that know more than
# this one (registry.py), run in order after the built-in ones.
_CHECKS: list[Callable[["ModelConfig"], None]] = []


def add_check(check: Callable[["ModelConfig"], None]) -> None:
    """Runs |check| on every ModelConfig built from now on (it raises ValueError)."""
    if check not in _CHECKS:
        _CHECKS.append(check)


@dataclass(frozen=True)
class OptimizerSpec:
    """The model JSON's "optimizer" object (train.optimizer, momentum,
    nesterov, optimizer_groups; docs/model.md, "Optimizers"). Which
    optimizer updates which parameter is optimizers.assignment's."""
    default: str = "adamw"
    momentum: float = 0.9
    nesterov: bool = False
    groups: tuple[str, ...] = ()  # "SELECTOR=OPTIMIZER", applied in order

    @classmethod
    def from_json(cls, d: Any) -> "OptimizerSpec":
        if not isinstance(d, Mapping):
            raise ValueError(f"model config: optimizer must be an object, got {d!r}")
        unknown = sorted(set(d) - {"default", "momentum", "nesterov", "groups"})
        if unknown:
            raise ValueError(f"model config: optimizer: unknown keys {unknown}")
        groups = d.get("groups") or []
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise ValueError(f"model config: optimizer.groups must be a list of \"SELECTOR=OPTIMIZER\" strings, "
                             f"got {groups!r}")
        return cls(default=str(d.get("default", "adamw")), momentum=float(d.get("momentum", 0.9)),
                   nesterov=bool(d.get("nesterov", False)), groups=tuple(groups))

    def to_json(self) -> dict[str, Any]:
        return {"default": self.default, "momentum": self.momentum, "nesterov": self.nesterov,
                "groups": list(self.groups)}


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    seq_len: int
    tie_embeddings: bool
    compute_dtype: str  # "f32" | "bf16"
    rope_theta: float
    init_std: float
    microbatch_size: int
    # Optional keys (absent from the model JSON and from to_dict() at their
    # defaults, so a config that does not set them keeps its bundle key):
    n_kv_heads: int = 0  # grouped-query attention: key/value heads; 0 = n_heads
    block: str = "llama"  # the block kind of every layer (registry.py; the built-in ones: blocks.py)
    layers: tuple[str, ...] = ()  # one kind per layer (a heterogeneous stack); () = block everywhere
    # The moe kind's (moe.py); the C schema's defaults, so that they too are
    # left out of the model JSON at these values.
    n_experts: int = 8
    moe_top_k: int = 2
    moe_aux_weight: float = 0.01
    moe_z_weight: float = 0.001
    # kernels.<op> (docs/kernels.md): the implementation of each kernel op,
    # as sorted (op, impl) pairs; ops left out (and every op at "xla") use
    # the plain-jnp reference, and the key is left out of the model JSON.
    kernels: tuple[tuple[str, str], ...] = ()
    # Rows of the embedding (and columns of an untied output projection):
    # vocab_size padded up, e.g. to a multiple of 64; 0 = vocab_size. Logits
    # of the padding ids are masked out of the loss and never sampled.
    vocab_padded: int = 0
    # data.packing (docs/model.md, "Packing"): "concat" (windows over the
    # concatenated corpus: today's programs, byte for byte), "none" (one
    # document per sequence, padding weighted 0) or "pack" (several
    # documents per sequence: the block and embedding programs take their
    # positions, attention stays inside each document). none and pack
    # normalise the loss by the global batch's sum of weights.
    packing: str = "concat"
    # The model JSON's "optimizer" object, present only when some parameter
    # is not updated by AdamW; None: AdamW everywhere (today's adamw_<group>
    # programs, byte for byte), and the key is left out of the model JSON.
    optimizer: OptimizerSpec | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.vocab_size > 0, "vocab_size must be > 0"),
            (self.d_model > 0, "d_model must be > 0"),
            (self.n_layers > 0, "n_layers must be > 0"),
            (self.n_heads > 0 and self.d_model % self.n_heads == 0,
             "d_model must be a multiple of n_heads"),
            ((self.d_model // max(self.n_heads, 1)) % 2 == 0, "head dim must be even (RoPE)"),
            (self.d_ff > 0, "d_ff must be > 0"),
            (self.seq_len > 0, "seq_len must be > 0"),
            (self.compute_dtype in ("f32", "bf16"), "compute_dtype must be f32 or bf16"),
            (self.rope_theta > 0, "rope_theta must be > 0"),
            (self.init_std > 0, "init_std must be > 0"),
            (self.microbatch_size > 0, "microbatch_size must be > 0"),
            (self.n_kv_heads >= 0 and (self.n_kv_heads == 0 or self.n_heads % self.n_kv_heads == 0),
             f"model.n_kv_heads ({self.n_kv_heads}) must divide model.n_heads ({self.n_heads})"),
            (not self.layers or len(self.layers) == self.n_layers,
             f"model.layers has {len(self.layers)} entries for model.n_layers = {self.n_layers}"),
            (self.vocab_padded == 0 or self.vocab_padded >= self.vocab_size,
             f"model.vocab_padded ({self.vocab_padded}) must be 0 or at least model.vocab_size ({self.vocab_size})"),
            (self.packing in PACKINGS, f"packing must be one of {'|'.join(PACKINGS)}, got {self.packing!r}"),
            (self.optimizer is None or 0.0 <= self.optimizer.momentum < 1.0,
             f"optimizer.momentum must be in [0, 1), got {self.optimizer and self.optimizer.momentum}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"model config: {msg} (got {self.to_dict()})")
        for check in _CHECKS:
            check(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        names = [f.name for f in fields(cls) if f.name not in _OPTIONAL]
        missing = [n for n in names if n not in d]
        if missing:
            raise ValueError(f"model config: missing keys {missing}")
        return cls(
            vocab_size=int(d["vocab_size"]), d_model=int(d["d_model"]),
            n_layers=int(d["n_layers"]), n_heads=int(d["n_heads"]), d_ff=int(d["d_ff"]),
            seq_len=int(d["seq_len"]), tie_embeddings=bool(d["tie_embeddings"]),
            compute_dtype=str(d["compute_dtype"]), rope_theta=float(d["rope_theta"]),
            init_std=float(d["init_std"]), microbatch_size=int(d["microbatch_size"]),
            n_kv_heads=int(d.get("n_kv_heads", 0) or 0), block=str(d.get("block", "llama") or "llama"),
            layers=tuple(str(k) for k in (d.get("layers") or ())),
            n_experts=int(d.get("n_experts", 8)), moe_top_k=int(d.get("moe_top_k", 2)),
            moe_aux_weight=float(d.get("moe_aux_weight", 0.01)), moe_z_weight=float(d.get("moe_z_weight", 0.001)),
            kernels=tuple(sorted((str(k), str(v)) for k, v in (d.get("kernels") or {}).items() if v != "xla")),
            vocab_padded=int(d.get("vocab_padded", 0) or 0),
            packing=str(d.get("packing", "concat") or "concat"),
            optimizer=OptimizerSpec.from_json(d["optimizer"]) if d.get("optimizer") is not None else None,
        )

    @classmethod
    def from_json(cls, text_or_path: str) -> "ModelConfig":
        """Accepts a JSON string or the path of a JSON file."""
        s = text_or_path.strip()
        if not s.startswith("{"):
            with open(text_or_path, encoding="utf-8") as f:
                s = f.read()
        return cls.from_dict(json.loads(s))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.n_kv_heads in (0, self.n_heads):
            del d["n_kv_heads"]
        if self.block == "llama":
            del d["block"]
        if not self.layers:
            del d["layers"]
        else:
            d["layers"] = list(self.layers)
        for k, default in _MOE_DEFAULTS.items():
            if d[k] == default:
                del d[k]
        if self.kernels:
            d["kernels"] = dict(self.kernels)
        else:
            del d["kernels"]
        if not self.vocab_padded:
            del d["vocab_padded"]
        if self.packing == "concat":
            del d["packing"]
        if self.optimizer is None:
            del d["optimizer"]
        else:
            d["optimizer"] = self.optimizer.to_json()
        return d

    def kernel(self, op: str) -> str:
        """The implementation of kernel op |op| (kernels.py): "xla" unless set."""
        return dict(self.kernels).get(op, "xla")

    @property
    def packed(self) -> bool:
        """packing == "pack": the block and embedding programs take positions."""
        return self.packing == "pack"

    @property
    def weighted_loss(self) -> bool:
        """packing none or pack: the head returns sum(ce * mask) / (mb * T), the
        trainer scales by (mb * T) / (the global batch's sum of weights)."""
        return self.packing != "concat"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads (grouped-query attention); n_heads without it."""
        return self.n_kv_heads or self.n_heads

    @property
    def vocab_rows(self) -> int:
        """Rows of wte (columns of w_out): vocab_padded, or vocab_size without padding."""
        return self.vocab_padded or self.vocab_size

    def layer_kinds(self) -> tuple[str, ...]:
        """The block kind of each layer, in order."""
        return self.layers if self.layers else (self.block,) * self.n_layers

    @property
    def cdtype(self) -> jnp.dtype:
        return jnp.dtype(jnp.bfloat16 if self.compute_dtype == "bf16" else jnp.float32)


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int
    microbatches: int
    lr: float
    min_lr_ratio: float
    warmup_steps: int
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    grad_clip: float
    eval_every: int
    eval_batches: int

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        ints = {"steps", "batch_size", "microbatches", "warmup_steps", "eval_every", "eval_batches"}
        kw = {k: (int(d[k]) if k in ints else float(d[k])) for k in cls.__dataclass_fields__}
        return cls(**kw)

    @property
    def hyper(self) -> np.ndarray:
        return np.array([self.beta1, self.beta2, self.eps, self.weight_decay], np.float32)
