"""What each family's config.json says, read once and validated: one frozen dataclass per family
and its reader, so the model code (`engine/models/<family>.py`) can trust every field.

No torch: the gateway and the CLI read model folders with this. Which reader a folder gets is the
family registry's (`families.FAMILIES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ModelLoadError(ValueError):
    """A model folder that cannot be served; the message names the file and what was expected."""


def require(cfg: dict[str, Any], key: str, path: Path) -> Any:
    if key not in cfg:
        raise ModelLoadError(f"{path}: missing required key {key!r}")
    return cfg[key]


def _first(cfg: dict[str, Any], keys: tuple[str, ...], path: Path) -> Any:
    """The first of `keys` present (Hugging Face names, then the older or remote-code ones)."""
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    raise ModelLoadError(f"{path}: missing required key {keys[0]!r}")


GELU_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


class _SplitHidden:
    """`head_dim` for a family whose heads split the hidden size evenly."""

    hidden_size: int
    num_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class _PositionTable:
    """`max_positions` for a family that uses every position it has (no offset)."""

    max_position_embeddings: int

    @property
    def max_positions(self) -> int:
        """Tokens per sequence the model has positions for."""
        return self.max_position_embeddings


@dataclass(frozen=True)
class BertConfig(_SplitHidden):
    """BERT and the encoders built like it (XLM-RoBERTa / RoBERTa)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int  # rows of the position table
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    # RoBERTa's positions start after the padding index (`padding_idx + 1`); BERT's at 0
    position_offset: int = 0
    # MPNet: buckets of its relative position bias (0: none, BERT and RoBERTa)
    relative_buckets: int = 0

    @property
    def max_positions(self) -> int:
        """Tokens per sequence the position table covers."""
        return self.max_position_embeddings - self.position_offset


@dataclass(frozen=True)
class NomicBertConfig(_SplitHidden, _PositionTable):
    """nomic-embed-text: BERT post-norm with rotary positions and SwiGLU, no biases but the
    norms'."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    rope_theta: float


@dataclass(frozen=True)
class ModernBertConfig(_SplitHidden, _PositionTable):
    """ModernBERT: pre-norm, rotary, GeGLU, every `n`th layer global, the others local."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    norm_bias: bool
    attention_bias: bool
    mlp_bias: bool
    hidden_act: str
    global_rope_theta: float
    local_rope_theta: float
    window: int  # a local layer's largest |query - key| distance (local_attention // 2)
    global_layers: tuple[bool, ...]  # per layer: full attention (True) or local


@dataclass(frozen=True)
class Gemma3Config(_PositionTable):
    """Gemma 3 text model as an encoder (EmbeddingGemma): GQA, q/k RMSNorm, four norms per layer,
    GeGLU, sliding-window and global layers, embeddings scaled by sqrt(hidden)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    global_rope_theta: float
    local_rope_theta: float
    sliding_window: int  # config.json's value (the whole window, both sides)
    global_layers: tuple[bool, ...]
    query_pre_attn_scalar: float
    hidden_act: str
    max_position_embeddings: int

    @property
    def window(self) -> int:
        """A sliding layer's largest |query - key|: transformers turns a bidirectional Gemma 3's
        `sliding_window` W into an exclusive bound of W // 2 + 1 on each side."""
        return self.sliding_window // 2


@dataclass(frozen=True)
class Qwen3Config(_PositionTable):
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (grouped-query attention)
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False


FamilyConfig = BertConfig | NomicBertConfig | ModernBertConfig | Gemma3Config | Qwen3Config


def _heads_divide(hidden: int, heads: int, path: Path) -> None:
    if heads <= 0 or hidden % heads:
        raise ModelLoadError(
            f"{path}: hidden_size {hidden} is not divisible by num_attention_heads {heads}"
        )


def _grouped_rotary_heads(cfg: Gemma3Config | Qwen3Config, path: Path) -> None:
    """Grouped-query attention needs whole groups; rotary, an even head dim."""
    if cfg.num_heads % cfg.num_kv_heads:
        raise ModelLoadError(
            f"{path}: num_attention_heads {cfg.num_heads} is not a multiple of "
            f"num_key_value_heads {cfg.num_kv_heads}"
        )
    if cfg.head_dim % 2:
        raise ModelLoadError(f"{path}: head_dim {cfg.head_dim} must be even for rotary")


def _rope(cfg: dict[str, Any], path: Path, layer_type: str | None = None) -> dict[str, Any]:
    """The rope settings of one layer type (transformers 5 `rope_parameters`, or older top-level
    keys), checked to be plain rotary."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    elif layer_type is not None and any(
        t in params for t in ("full_attention", "sliding_attention")
    ):
        params = {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ModelLoadError(f"{path}: rope_type {kind!r} is not supported; expected 'default'")
    return dict(params)


def read_bert(
    cfg: dict[str, Any], path: Path, *, roberta: bool = False, mpnet: bool = False
) -> BertConfig:
    """BERT; `roberta`: positions after the padding index, no token types; `mpnet`: RoBERTa's
    positions plus a relative position bias, and no token type embeddings at all."""
    roberta = roberta or mpnet
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ModelLoadError(
            f"{path}: position_embedding_type {cfg['position_embedding_type']!r} "
            "is not supported; expected 'absolute'"
        )
    bert = BertConfig(
        vocab_size=int(require(cfg, "vocab_size", path)),
        hidden_size=int(require(cfg, "hidden_size", path)),
        num_layers=int(require(cfg, "num_hidden_layers", path)),
        num_heads=int(require(cfg, "num_attention_heads", path)),
        intermediate_size=int(require(cfg, "intermediate_size", path)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 512)),
        type_vocab_size=1 if mpnet else int(cfg.get("type_vocab_size", 1 if roberta else 2)),
        layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12 if not roberta else 1e-5)),
        hidden_act=str(cfg.get("hidden_act", "gelu")),
        # NOTE: transformers' MPNet counts positions from its fixed padding index 1 whatever the
        # config's pad_token_id says (`MPNetEmbeddings.padding_idx = 1`); RoBERTa reads the config
        position_offset=2 if mpnet else int(cfg.get("pad_token_id", 1)) + 1 if roberta else 0,
        relative_buckets=int(cfg.get("relative_attention_num_buckets", 32)) if mpnet else 0,
    )
    _heads_divide(bert.hidden_size, bert.num_heads, path)
    if bert.hidden_act not in GELU_ACTS:
        raise ModelLoadError(f"{path}: unsupported hidden_act {bert.hidden_act!r}")
    if bert.max_positions <= 0:
        raise ModelLoadError(
            f"{path}: max_position_embeddings {bert.max_position_embeddings} leaves no "
            f"positions after the padding offset {bert.position_offset}"
        )
    return bert


def read_nomic_bert(cfg: dict[str, Any], path: Path) -> NomicBertConfig:
    """Both the transformers config and nomic's remote-code one (n_embd, n_head, ...)."""
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "silu")))
    if act not in ("silu", "swiglu"):
        raise ModelLoadError(f"{path}: unsupported hidden_act {act!r}; expected silu (SwiGLU)")
    for key, want in (("prenorm", False), ("qkv_proj_bias", False), ("mlp_fc1_bias", False)):
        if key in cfg and bool(cfg[key]) != want:
            raise ModelLoadError(f"{path}: {key} {cfg[key]!r} is not supported")
    if float(cfg.get("rotary_emb_fraction", 1.0)) != 1.0 or cfg.get("rotary_emb_interleaved"):
        raise ModelLoadError(f"{path}: only full, non-interleaved rotary is supported")
    rope = _rope(cfg, path)
    hidden = int(_first(cfg, ("hidden_size", "n_embd"), path))
    heads = int(_first(cfg, ("num_attention_heads", "n_head"), path))
    nomic = NomicBertConfig(
        vocab_size=int(require(cfg, "vocab_size", path)),
        hidden_size=hidden,
        num_layers=int(_first(cfg, ("num_hidden_layers", "n_layer"), path)),
        num_heads=heads,
        intermediate_size=int(_first(cfg, ("intermediate_size", "n_inner"), path)),
        max_position_embeddings=int(
            cfg.get("max_position_embeddings") or cfg.get("n_positions") or 2048
        ),
        type_vocab_size=int(cfg.get("type_vocab_size", 2)),
        layer_norm_eps=float(cfg.get("layer_norm_eps", cfg.get("layer_norm_epsilon", 1e-12))),
        rope_theta=float(rope.get("rope_theta", cfg.get("rotary_emb_base", 1000.0))),
    )
    _heads_divide(hidden, heads, path)
    return nomic


def _layer_types(cfg: dict[str, Any], layers: int, every: int, path: Path) -> tuple[bool, ...]:
    """Per layer, True for full attention: `layer_types` when given, else every `every`th."""
    types = cfg.get("layer_types")
    if types is None:
        return tuple(i % every == 0 for i in range(layers))
    if len(types) != layers or set(types) - {"full_attention", "sliding_attention"}:
        raise ModelLoadError(
            f"{path}: layer_types must list {layers} of full_attention / sliding_attention"
        )
    return tuple(t == "full_attention" for t in types)


def read_modernbert(cfg: dict[str, Any], path: Path) -> ModernBertConfig:
    hidden = int(require(cfg, "hidden_size", path))
    heads = int(require(cfg, "num_attention_heads", path))
    layers = int(require(cfg, "num_hidden_layers", path))
    act = str(cfg.get("hidden_activation", "gelu"))
    if act not in GELU_ACTS:
        raise ModelLoadError(f"{path}: unsupported hidden_activation {act!r}")
    full, local = _rope(cfg, path, "full_attention"), _rope(cfg, path, "sliding_attention")
    modern = ModernBertConfig(
        vocab_size=int(require(cfg, "vocab_size", path)),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=int(require(cfg, "intermediate_size", path)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 8192)),
        norm_eps=float(cfg.get("norm_eps", 1e-5)),
        norm_bias=bool(cfg.get("norm_bias", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        hidden_act=act,
        global_rope_theta=float(full.get("rope_theta", cfg.get("global_rope_theta", 160_000.0))),
        local_rope_theta=float(local.get("rope_theta", cfg.get("local_rope_theta", 10_000.0))),
        window=int(cfg.get("local_attention", 128)) // 2,
        global_layers=_layer_types(
            cfg, layers, int(cfg.get("global_attn_every_n_layers", 3)), path
        ),
    )
    _heads_divide(hidden, heads, path)
    return modern


def read_gemma3(cfg: dict[str, Any], path: Path) -> Gemma3Config:
    if cfg.get("attn_logit_softcapping") is not None:
        raise ModelLoadError(f"{path}: attn_logit_softcapping is not supported")
    act = str(cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh")))
    if act not in ("gelu_pytorch_tanh", "gelu"):
        raise ModelLoadError(f"{path}: unsupported hidden_activation {act!r}")
    hidden = int(require(cfg, "hidden_size", path))
    heads = int(require(cfg, "num_attention_heads", path))
    layers = int(require(cfg, "num_hidden_layers", path))
    full, local = _rope(cfg, path, "full_attention"), _rope(cfg, path, "sliding_attention")
    every = int(cfg.get("sliding_window_pattern", 6))
    gemma = Gemma3Config(
        vocab_size=int(require(cfg, "vocab_size", path)),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or 256),
        intermediate_size=int(require(cfg, "intermediate_size", path)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        global_rope_theta=float(full.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))),
        local_rope_theta=float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0))),
        sliding_window=int(cfg.get("sliding_window") or 4096),
        # Gemma 3's pattern: five sliding layers, then a global one
        global_layers=_layer_types(cfg, layers, every, path)
        if cfg.get("layer_types")
        else tuple((i + 1) % every == 0 for i in range(layers)),
        query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)),
        hidden_act=act,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
    )
    _grouped_rotary_heads(gemma, path)
    return gemma


def read_qwen3(cfg: dict[str, Any], path: Path) -> Qwen3Config:
    rope = _rope(cfg, path)
    if cfg.get("use_sliding_window"):
        raise ModelLoadError(f"{path}: use_sliding_window is not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{path}: unsupported hidden_act {cfg['hidden_act']!r}")
    hidden = int(require(cfg, "hidden_size", path))
    heads = int(require(cfg, "num_attention_heads", path))
    qwen3 = Qwen3Config(
        vocab_size=int(require(cfg, "vocab_size", path)),
        hidden_size=hidden,
        num_layers=int(require(cfg, "num_hidden_layers", path)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(require(cfg, "intermediate_size", path)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        attention_bias=bool(cfg.get("attention_bias", False)),
    )
    _grouped_rotary_heads(qwen3, path)
    return qwen3
