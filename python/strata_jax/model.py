"""The decoder-only transformer, as pure functions on parameter dicts.

Everything here is shape-static and side-effect free so that the same
functions back both the exported per-layer programs (export.py) and the
monolithic reference (reference_train.py). See docs/model.md.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

import jax
import jax.numpy as jnp

Array = jax.Array
Params = dict[str, Array]

BLOCK_PARAMS: tuple[str, ...] = (
    "attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down",
)
BLOCK_MATRICES: tuple[str, ...] = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
RESIDUAL_OUT: frozenset[str] = frozenset({"wo", "w_down"})  # scaled by 1/sqrt(2 n_layers)
NORM_EPS = 1e-6
LN_EPS = 1e-5  # LayerNorm's epsilon (the gpt2 family: GPT-2's own value)


_MOE_DEFAULTS: dict[str, Any] = {"n_experts": 8, "moe_top_k": 2, "moe_aux_weight": 0.01, "moe_z_weight": 0.001}
_OPTIONAL: frozenset[str] = frozenset({"n_kv_heads", "block", "layers", "kernels", "vocab_padded", *_MOE_DEFAULTS})


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
    block: str = "llama"  # the block kind of every layer (blocks.py)
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
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"model config: {msg} (got {self.to_dict()})")
        from . import blocks  # the registry imports this module
        for key, kinds in (("model.block", [self.block]), ("model.layers", list(self.layers))):
            for kind in kinds:
                if kind not in blocks.KINDS:
                    raise ValueError(f"{key}: unknown block kind {kind!r} (registered: "
                                     f"{', '.join(sorted(blocks.KINDS))}; docs/model.md, \"Block kinds\")")
        from . import kernels as K
        K.check_selection(dict(self.kernels))
        families = {k: blocks.KINDS[k].family for k in dict.fromkeys(self.layer_kinds())}
        if len(set(families.values())) > 1:
            raise ValueError(f"model.layers: block kinds of different families cannot share a stack "
                             f"({', '.join(f'{k}: {f}' for k, f in families.items())}): the family decides the "
                             f"embedding and the head (docs/model.md, \"Families\")")
        for kind in dict.fromkeys(self.layer_kinds()):
            check = blocks.KINDS[kind].validate
            if check is not None:
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
        return d

    def kernel(self, op: str) -> str:
        """The implementation of kernel op |op| (kernels.py): "xla" unless set."""
        return dict(self.kernels).get(op, "xla")

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

    @property
    def family(self) -> str:
        """The embedding and head the stack's kinds go with (blocks.BlockKind.family):
        "llama" (token embedding; RMSNorm, then the output projection) or
        "gpt2" (token plus learned position embedding; LayerNorm with bias)."""
        from . import blocks
        return blocks.KINDS[self.layer_kinds()[0]].family

    def layer_kinds(self) -> tuple[str, ...]:
        """The block kind of each layer, in order."""
        return self.layers if self.layers else (self.block,) * self.n_layers

    @property
    def cdtype(self) -> jnp.dtype:
        return jnp.dtype(jnp.bfloat16 if self.compute_dtype == "bf16" else jnp.float32)


# --- parameter structure -------------------------------------------------------

def head_param_names(cfg: ModelConfig) -> tuple[str, ...]:
    norm = ("final_norm", "final_norm_bias") if cfg.family == "gpt2" else ("final_norm",)
    return norm if cfg.tie_embeddings else norm + ("w_out",)


def embed_param_names(cfg: ModelConfig) -> tuple[str, ...]:
    """wte first (the tied head reads it), then the gpt2 family's positions."""
    return ("wte", "wpe") if cfg.family == "gpt2" else ("wte",)


def group_param_names(cfg: ModelConfig, group: str) -> tuple[str, ...]:
    if group == "embed":
        return embed_param_names(cfg)
    if group == "head":
        return head_param_names(cfg)
    from . import blocks
    kind = blocks.kind_of_group(group)
    if kind is None:
        raise ValueError(f"unknown group {group!r}")
    return kind.params(cfg)


def param_shape(cfg: ModelConfig, local: str, group: str | None = None) -> tuple[int, ...]:
    """Shape of parameter |local|; |group| names a block kind's group whose
    parameters are not llama's (blocks.BlockKind.shape)."""
    if group not in (None, "embed", "head", "block"):
        from . import blocks
        kind = blocks.kind_of_group(group)
        if kind is not None and kind.shape is not None:
            return kind.shape(cfg, local)
    V, D, F = cfg.vocab_rows, cfg.d_model, cfg.d_ff
    KV = cfg.kv_heads * cfg.head_dim
    return {
        "wte": (V, D), "wpe": (cfg.seq_len, D), "attn_norm": (D,), "wq": (D, D), "wk": (D, KV), "wv": (D, KV),
        "wo": (D, D), "mlp_norm": (D,), "w_gate": (D, F), "w_up": (D, F), "w_down": (F, D),
        "final_norm": (D,), "final_norm_bias": (D,), "w_out": (D, V),
    }[local]


def param_init_std(cfg: ModelConfig, local: str, group: str | None = None) -> float | None:
    """Std of the normal init, or None for norms (initialised to ones) and biases (zeros)."""
    if len(param_shape(cfg, local, group)) < 2:
        return None
    resid_out = RESIDUAL_OUT
    if group not in (None, "embed", "head"):
        from . import blocks
        kind = blocks.kind_of_group(group)
        if kind is not None and kind.residual_out is not None:
            resid_out = kind.residual_out
    if local in resid_out:
        return cfg.init_std / math.sqrt(2.0 * cfg.n_layers)
    return cfg.init_std


def param_init_text(cfg: ModelConfig, local: str, group: str | None = None) -> str:
    """The manifest's "init" of a parameter: "normal(std)", "ones" or "zeros"."""
    std = param_init_std(cfg, local, group)
    if std is not None:
        return f"normal({std!r})"
    zeros: frozenset[str] = frozenset({"final_norm_bias"})
    if group not in (None, "embed", "head"):
        from . import blocks
        kind = blocks.kind_of_group(group)
        zeros = kind.zeros if kind is not None else frozenset()
    return "zeros" if local in zeros else "ones"


# --- init ----------------------------------------------------------------------

def _normal(key: Array, shape: tuple[int, ...], std: float) -> Array:
    return jax.random.normal(key, shape, jnp.float32) * jnp.float32(std)


def init_embed(cfg: ModelConfig, seed: Array) -> Params:
    """wte: normal rows for the vocabulary, zeros for the padding rows (no
    token embeds them; masked out of the tied head's logits); the gpt2
    family's wpe: normal, its own key (fold_in(root, 3))."""
    key = jax.random.fold_in(jax.random.PRNGKey(seed), 0)
    wte = _normal(key, (cfg.vocab_size, cfg.d_model), cfg.init_std)
    if cfg.vocab_rows > cfg.vocab_size:
        wte = jnp.concatenate([wte, jnp.zeros((cfg.vocab_rows - cfg.vocab_size, cfg.d_model), jnp.float32)])
    out = {"wte": wte}
    if cfg.family == "gpt2":
        out["wpe"] = _normal(jax.random.fold_in(jax.random.PRNGKey(seed), 3), param_shape(cfg, "wpe"), cfg.init_std)
    return out


def init_block(cfg: ModelConfig, seed: Array, layer: Array, n_layers: Array) -> Params:
    # One normal draw for all seven matrices, cut in BLOCK_MATRICES order:
    # the threefry kernel is compiled once, not seven times (block_init was
    # the slowest program of a cold start to compile; docs/performance.md).
    # The depth is an input, not a constant: the residual-output scale is
    # computed on the device, so block_init's text (and its compiled
    # executable) is the same for every depth, like every other program.
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), 1), layer)
    sizes = [math.prod(param_shape(cfg, name)) for name in BLOCK_MATRICES]
    flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
    resid_std = jnp.float32(cfg.init_std) / jnp.sqrt(jnp.float32(2.0) * n_layers.astype(jnp.float32))
    mats: Params = {}
    offset = 0
    for name, size in zip(BLOCK_MATRICES, sizes):
        std = resid_std if name in RESIDUAL_OUT else jnp.float32(cfg.init_std)
        mats[name] = flat[offset:offset + size].reshape(param_shape(cfg, name)) * std
        offset += size
    out: Params = {}
    for name in BLOCK_PARAMS:
        out[name] = mats[name] if name in mats else jnp.ones(param_shape(cfg, name), jnp.float32)
    return out


def init_head(cfg: ModelConfig, seed: Array) -> Params:
    out: Params = {"final_norm": jnp.ones(param_shape(cfg, "final_norm"), jnp.float32)}
    if cfg.family == "gpt2":
        out["final_norm_bias"] = jnp.zeros(param_shape(cfg, "final_norm_bias"), jnp.float32)
    if not cfg.tie_embeddings:
        key = jax.random.fold_in(jax.random.PRNGKey(seed), 2)
        w_out = _normal(key, (cfg.d_model, cfg.vocab_size), cfg.init_std)
        if cfg.vocab_rows > cfg.vocab_size:
            w_out = jnp.concatenate([w_out, jnp.zeros((cfg.d_model, cfg.vocab_rows - cfg.vocab_size), jnp.float32)], 1)
        out["w_out"] = w_out
    return out


# --- forward -------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _einsum_bf16(spec: str, a: Array, b: Array) -> Array:
    return jnp.einsum(spec, a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                      preferred_element_type=jnp.float32)


def _einsum_bf16_fwd(spec: str, a: Array, b: Array) -> tuple[Array, tuple[Array, Array]]:
    return _einsum_bf16(spec, a, b), (a, b)


def _einsum_bf16_bwd(spec: str, res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
    # JAX's own transpose of a bf16 dot with an f32 result multiplies the f32
    # cotangent by the bf16 operand upcast to f32: the backward's matmuls (two
    # thirds of a step's) would run in f32. Here both are bf16 x bf16 with f32
    # accumulation, like the forward (mixed precision's usual bf16 cotangent).
    a, b = res
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    g16, a16, b16 = g.astype(jnp.bfloat16), a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    da = _canonical_dot_bf16(f"{out},{sb}->{sa}", g16, b16)
    db = _canonical_dot_bf16(f"{sa},{out}->{sb}", a16, g16)
    return da.astype(a.dtype), db.astype(b.dtype)


def _canonical_dot_bf16(spec: str, a: Array, b: Array) -> Array:
    """einsum |spec| of bf16 a, b as one [batch, m, k] x [batch, k, n] -> f32 dot.

    XLA:CPU runs a bf16 x bf16 -> f32 dot only in this row-major form: one
    whose contracting dimension is not minor, or whose result XLA transposes
    by layout, fails at run time ("Unsupported element type for
    DotThunk::Execute"). The barriers keep XLA from folding the transposes
    back into the dot."""
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    batch = [c for c in out if c in sa and c in sb]
    contract = [c for c in sa if c in sb and c not in out]
    free_a = [c for c in sa if c not in sb]
    free_b = [c for c in sb if c not in sa]
    size = {**dict(zip(sa, a.shape)), **dict(zip(sb, b.shape))}
    n = lambda cs: math.prod(size[c] for c in cs)  # noqa: E731
    at = jnp.transpose(a, [sa.index(c) for c in batch + free_a + contract])
    bt = jnp.transpose(b, [sb.index(c) for c in batch + contract + free_b])
    at, bt = jax.lax.optimization_barrier((at.reshape(n(batch), n(free_a), n(contract)),
                                           bt.reshape(n(batch), n(contract), n(free_b))))
    r = jax.lax.dot_general(at, bt, (((2,), (1,)), ((0,), (0,))), preferred_element_type=jnp.float32)
    r = jax.lax.optimization_barrier(r).reshape([size[c] for c in batch + free_a + free_b])
    return jnp.transpose(r, [(batch + free_a + free_b).index(c) for c in out])


_einsum_bf16.defvjp(_einsum_bf16_fwd, _einsum_bf16_bwd)


def cdot(cfg: ModelConfig, spec: str, a: Array, b: Array) -> Array:
    """einsum |spec| (two operands, every index of one operand also in the other
    or in the result) in compute dtype, f32 result. bf16: forward and backward
    matmuls take bf16 operands (_einsum_bf16_bwd); f32: a plain einsum."""
    if cfg.compute_dtype == "bf16":
        return _einsum_bf16(spec, a, b)
    c = cfg.cdtype
    return jnp.einsum(spec, a.astype(c), b.astype(c), preferred_element_type=jnp.float32)


def _mm(cfg: ModelConfig, a: Array, b: Array) -> Array:
    """Matmul over the last dim of a / first dim of b in compute dtype, f32 result."""
    if cfg.compute_dtype == "bf16":
        lead = "abcdefgh"[:a.ndim - 1]
        return _einsum_bf16(f"{lead}k,kn->{lead}n", a, b)
    return jnp.matmul(a.astype(cfg.cdtype), b.astype(cfg.cdtype),
                      preferred_element_type=jnp.float32)


def layer_norm(x: Array, gain: Array, bias: Array) -> Array:
    """LayerNorm over the last axis, in f32 (biased variance, LN_EPS)."""
    x = x.astype(jnp.float32)
    mu = jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    return xc * jax.lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + LN_EPS) * gain + bias


def rms_norm(x: Array, gain: Array) -> Array:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + NORM_EPS) * gain


def norm(cfg: ModelConfig, x: Array, gain: Array) -> Array:
    """RMSNorm through the implementation kernels.rmsnorm selects (kernels.py)."""
    from . import kernels as K
    impl = cfg.kernel("rmsnorm")
    return rms_norm(x, gain) if impl == "xla" else K.call("rmsnorm", impl, x.astype(jnp.float32), gain)


def swiglu(cfg: ModelConfig, gate: Array, up: Array) -> Array:
    """silu(gate) * up through the implementation kernels.swiglu selects."""
    from . import kernels as K
    impl = cfg.kernel("swiglu")
    return jax.nn.silu(gate) * up if impl == "xla" else K.call("swiglu", impl, gate, up)


def rope_tables(cfg: ModelConfig) -> tuple[Array, Array]:
    """cos, sin of shape [T, Dh] (rotate-half layout: the half-table repeated)."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(half, dtype=jnp.float32) * 2.0 / cfg.head_dim))
    ang = jnp.arange(cfg.seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    ang = jnp.concatenate([ang, ang], axis=-1)
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """x: [B, T, H, Dh] f32; cos/sin: [T, Dh]."""
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[None, :, None, :] + rot * sin[None, :, None, :]


def expand_kv(cfg: ModelConfig, t: Array) -> Array:
    """[B, T, KV, Dh] keys or values -> [B, T, KV * g, Dh], each head repeated
    g = n_heads / n_kv_heads times (query head h reads key/value head h // g).
    The identity without grouped-query attention, so those programs are
    unchanged. g is the same on a tensor-parallel device's share of heads."""
    g = cfg.n_heads // cfg.kv_heads
    return t if g == 1 else jnp.repeat(t, g, axis=2)


def attention(cfg: ModelConfig, p: Params, x: Array) -> Array:
    B, T, D = x.shape
    H, Dh = cfg.n_heads, cfg.head_dim
    q = _mm(cfg, x, p["wq"]).reshape(B, T, H, Dh)
    k = _mm(cfg, x, p["wk"]).reshape(B, T, -1, Dh)
    v = _mm(cfg, x, p["wv"]).reshape(B, T, -1, Dh)
    cos, sin = rope_tables(cfg)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    impl = cfg.kernel("attention")
    if impl != "xla":
        # The kernel op (kernels.py, contract row "attention"): k and v keep
        # their n_kv_heads heads; f32 whatever compute_dtype (q, k, v are f32 here).
        from . import kernels as K
        return _mm(cfg, K.call("attention", impl, q, k, v).reshape(B, T, D), p["wo"])
    k, v = expand_kv(cfg, k), expand_kv(cfg, v)
    scores = cdot(cfg, "bqhd,bkhd->bhqk", q, k) / jnp.float32(math.sqrt(Dh))
    causal = jnp.tril(jnp.ones((T, T), dtype=jnp.bool_))
    scores = jnp.where(causal[None, None], scores, jnp.float32(-1e30))
    probs = jax.nn.softmax(scores, axis=-1)
    out = cdot(cfg, "bhqk,bkhd->bqhd", probs, v).reshape(B, T, D)
    return _mm(cfg, out, p["wo"])


def mlp(cfg: ModelConfig, p: Params, x: Array) -> Array:
    return _mm(cfg, swiglu(cfg, _mm(cfg, x, p["w_gate"]), _mm(cfg, x, p["w_up"])), p["w_down"])


def block_fwd(cfg: ModelConfig, p: Params, x: Array) -> Array:
    """One transformer block: x [B,T,D] f32 -> y [B,T,D] f32."""
    x = x + attention(cfg, p, norm(cfg, x, p["attn_norm"]))
    return x + mlp(cfg, p, norm(cfg, x, p["mlp_norm"]))


def embed_fwd(cfg: ModelConfig, wte: Array, tokens: Array) -> Array:
    del cfg
    return jnp.take(wte, tokens, axis=0).astype(jnp.float32)


def embed(cfg: ModelConfig, p: Params, tokens: Array, pos: Array | int = 0) -> Array:
    """The embedding group's forward: wte[tokens], plus for the gpt2 family
    the learned positions wpe[pos .. pos + S - 1] of tokens [B, S]."""
    x = embed_fwd(cfg, p["wte"], tokens)
    if cfg.family == "gpt2":
        x = x + jax.lax.dynamic_slice_in_dim(p["wpe"], pos, tokens.shape[-1], 0)[None]
    return x


def final_norm(cfg: ModelConfig, p: Params, x: Array) -> Array:
    if cfg.family == "gpt2":
        return layer_norm(x, p["final_norm"], p["final_norm_bias"])
    return norm(cfg, x, p["final_norm"])


def mask_padding(cfg: ModelConfig, logits: Array) -> Array:
    """Logits of the padding ids (vocab_size .. vocab_padded - 1) replaced by
    -1e30: after the f32 log-softmax they weigh exactly 0 and get no gradient."""
    if cfg.vocab_rows == cfg.vocab_size:
        return logits
    real = jnp.arange(cfg.vocab_rows) < cfg.vocab_size
    return jnp.where(real, logits, jnp.float32(-1e30))


def head_logits(cfg: ModelConfig, p: Params, wte: Array | None, x: Array) -> Array:
    """Logits over vocab_rows ids (padding ids not masked: head_loss does that)."""
    h = final_norm(cfg, p, x)
    w_out = wte.T if cfg.tie_embeddings else p["w_out"]
    assert w_out is not None
    return _mm(cfg, h, w_out)


def masked_ce(logits: Array, targets: Array, mask: Array) -> Array:
    """sum(cross_entropy * mask) / sum(mask), log-softmax in f32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    ce = -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    mask = mask.astype(jnp.float32)
    return jnp.sum(ce * mask) / jnp.sum(mask)


def head_loss(cfg: ModelConfig, p: Params, wte: Array | None, x: Array,
              targets: Array, mask: Array) -> Array:
    logits = mask_padding(cfg, head_logits(cfg, p, wte, x))
    impl = cfg.kernel("cross_entropy")
    if impl == "xla":
        return masked_ce(logits, targets, mask)
    # kernels.cross_entropy (docs/kernels.md): the per-row loss through the
    # kernel on [B*T, V]; the padding ids' -1e30 above and the masked mean
    # below stay jnp.
    from . import kernels as K
    V = logits.shape[-1]
    ce = K.call("cross_entropy", impl, logits.astype(jnp.float32).reshape(-1, V), targets.astype(jnp.int32).reshape(-1))
    mask = mask.astype(jnp.float32)
    return jnp.sum(ce.reshape(mask.shape) * mask) / jnp.sum(mask)


# --- the whole model (reference, tests) ---------------------------------------

FullParams = dict[str, Any]  # {"embed": Params, "blocks": list[Params], "head": Params}


@functools.lru_cache(maxsize=16)
def _jitted_inits(cfg: ModelConfig) -> tuple[Any, dict[str, Any], Any]:
    from . import blocks
    kinds = {k: jax.jit(functools.partial(blocks.KINDS[k].init, cfg)) for k in set(cfg.layer_kinds())}
    return (jax.jit(functools.partial(init_embed, cfg)), kinds, jax.jit(functools.partial(init_head, cfg)))


def init_params(cfg: ModelConfig, seed: int) -> FullParams:
    """Same values as the embed_init/<kind>_init/head_init programs."""
    emb, blk, head = _jitted_inits(cfg)
    s = jnp.int32(seed)
    depth = jnp.int32(cfg.n_layers)
    return {"embed": emb(s), "blocks": [blk[k](s, jnp.int32(i), depth) for i, k in enumerate(cfg.layer_kinds())],
            "head": head(s)}


def model_loss(cfg: ModelConfig, params: FullParams, tokens: Array, targets: Array,
               mask: Array) -> Array:
    """The whole model's loss: each layer's kind's reference forward."""
    from . import blocks
    wte = params["embed"]["wte"]
    x = embed(cfg, params["embed"], tokens)
    for kind, p in zip(cfg.layer_kinds(), params["blocks"], strict=True):
        x = blocks.KINDS[kind].fwd(cfg, p, x)
    return head_loss(cfg, params["head"], wte if cfg.tie_embeddings else None, x, targets, mask)


def model_objective(cfg: ModelConfig, params: FullParams, tokens: Array, targets: Array,
                    mask: Array) -> tuple[Array, tuple[Array, dict[str, list[Array]]]]:
    """What training differentiates: the head's loss plus, for every layer
    whose kind has metrics (blocks.BlockKind.metrics: an MoE layer's
    auxiliary losses), its kind's objective of them. Returns (objective,
    (loss, {metric name: [value per such layer]}))."""
    from . import blocks
    wte = params["embed"]["wte"]
    x = embed(cfg, params["embed"], tokens)
    extra: Array | None = None  # stays None (nothing added) for a stack without metrics
    metrics: dict[str, list[Array]] = {}
    for kind_name, p in zip(cfg.layer_kinds(), params["blocks"], strict=True):
        kind = blocks.KINDS[kind_name]
        if kind.fwd_metrics is None:
            x = kind.fwd(cfg, p, x)
            continue
        x, mets = kind.fwd_metrics(cfg, p, x)
        assert kind.objective is not None and kind.metrics is not None
        share = kind.objective(cfg, mets)
        extra = share if extra is None else extra + share
        for (name, _), v in zip(kind.metrics(cfg), mets, strict=True):
            metrics.setdefault(name, []).append(v)
    loss = head_loss(cfg, params["head"], wte if cfg.tie_embeddings else None, x, targets, mask)
    return (loss if extra is None else loss + extra), (loss, metrics)


def flat_param_names(cfg: ModelConfig) -> list[str]:
    """Names of the manifest's parameter table, in table order."""
    from . import blocks
    names = list(embed_param_names(cfg))
    for i, kind in enumerate(cfg.layer_kinds()):
        names += [f"layers.{i}.{n}" for n in blocks.KINDS[kind].params(cfg)]
    return names + list(head_param_names(cfg))


def flatten_params(params: FullParams) -> dict[str, Array]:
    out: dict[str, Array] = dict(params["embed"])
    for i, p in enumerate(params["blocks"]):
        out.update({f"layers.{i}.{k}": v for k, v in p.items()})
    out.update(params["head"])
    return out
