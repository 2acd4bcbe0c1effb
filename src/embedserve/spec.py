"""What a model folder says about the model: architecture, shapes, pooling, limits, prompts.

Read once from a local Hugging Face / sentence-transformers folder and validated in one place,
so every later layer can trust it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

PoolingMethod = Literal["mean", "cls", "last"]
AttentionKind = Literal["bidirectional", "causal"]

POOLING_METHODS: tuple[str, ...] = ("mean", "cls", "last")

# config.json "architectures" / "model_type" values this engine can run, by family.
BERT_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining")
SUPPORTED_ARCHITECTURES: tuple[str, ...] = BERT_ARCHITECTURES


class ModelLoadError(ValueError):
    """A model folder that cannot be served; the message names the file and what was expected."""


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class ModelSpec:
    """Everything the engine and the tokenizer side need to know about one model folder."""

    path: Path
    family: Literal["bert"]
    architecture: str
    bert: BertConfig
    hidden_size: int
    pooling: PoolingMethod
    attention: AttentionKind
    normalize: bool  # the folder ends in a Normalize module: outputs are unit vectors by default
    max_seq_length: int  # tokens per sequence, special tokens included
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None


def _read_json(path: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None


def _require(cfg: dict[str, Any], key: str, path: Path) -> Any:
    if key not in cfg:
        raise ModelLoadError(f"{path}: missing required key {key!r}")
    return cfg[key]


def _pooling_from_folder(folder: Path) -> PoolingMethod | None:
    """The pooling method declared by a sentence-transformers folder, if any."""
    modules_path = folder / "modules.json"
    if not modules_path.exists():
        return None
    for module in _read_json(modules_path):
        if module.get("type", "").endswith("Pooling"):
            pool_cfg_path = folder / module.get("path", "1_Pooling") / "config.json"
            pool_cfg = _read_json(pool_cfg_path)
            if pool_cfg.get("pooling_mode_mean_tokens"):
                return "mean"
            if pool_cfg.get("pooling_mode_cls_token"):
                return "cls"
            if pool_cfg.get("pooling_mode_lasttoken"):
                return "last"
            raise ModelLoadError(
                f"{pool_cfg_path}: unsupported pooling mode; expected one of "
                "pooling_mode_mean_tokens, pooling_mode_cls_token, pooling_mode_lasttoken"
            )
    return None


def _has_normalize(folder: Path) -> bool:
    modules_path = folder / "modules.json"
    if not modules_path.exists():
        return False
    return any(m.get("type", "").endswith("Normalize") for m in _read_json(modules_path))


def read_model_spec(
    folder: str | Path,
    *,
    pooling: str | None = None,
) -> ModelSpec:
    """Read and validate a model folder. `pooling` overrides what the folder declares."""
    path = Path(folder)
    if not path.is_dir():
        raise ModelLoadError(f"{path}: not a directory (expected a model folder with config.json)")
    config_path = path / "config.json"
    cfg = _read_json(config_path)
    architectures = cfg.get("architectures") or []
    arch = architectures[0] if architectures else cfg.get("model_type", "<none>")
    if cfg.get("model_type") != "bert" and arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{config_path}: unsupported architecture {arch!r} "
            f"(model_type {cfg.get('model_type')!r}); supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ModelLoadError(
            f"{config_path}: position_embedding_type {cfg['position_embedding_type']!r} "
            "is not supported; expected 'absolute'"
        )
    bert = BertConfig(
        vocab_size=int(_require(cfg, "vocab_size", config_path)),
        hidden_size=int(_require(cfg, "hidden_size", config_path)),
        num_layers=int(_require(cfg, "num_hidden_layers", config_path)),
        num_heads=int(_require(cfg, "num_attention_heads", config_path)),
        intermediate_size=int(_require(cfg, "intermediate_size", config_path)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 512)),
        type_vocab_size=int(cfg.get("type_vocab_size", 2)),
        layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
        hidden_act=str(cfg.get("hidden_act", "gelu")),
    )
    if bert.hidden_size % bert.num_heads:
        raise ModelLoadError(
            f"{config_path}: hidden_size {bert.hidden_size} is not divisible by "
            f"num_attention_heads {bert.num_heads}"
        )
    if bert.hidden_act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
        raise ModelLoadError(f"{config_path}: unsupported hidden_act {bert.hidden_act!r}")

    declared = _pooling_from_folder(path)
    method = pooling or declared or "cls"
    if method not in POOLING_METHODS:
        raise ValueError(f"pooling {method!r} is not one of {', '.join(POOLING_METHODS)}")

    max_len = bert.max_position_embeddings
    st_cfg_path = path / "sentence_bert_config.json"
    if st_cfg_path.exists():
        max_len = min(max_len, int(_read_json(st_cfg_path).get("max_seq_length", max_len)))

    prompts: dict[str, str] = {}
    default_prompt_name = None
    prompt_cfg_path = path / "config_sentence_transformers.json"
    if prompt_cfg_path.exists():
        prompt_cfg = _read_json(prompt_cfg_path)
        prompts = {str(k): str(v) for k, v in (prompt_cfg.get("prompts") or {}).items()}
        default_prompt_name = prompt_cfg.get("default_prompt_name")

    return ModelSpec(
        path=path,
        family="bert",
        architecture=arch,
        bert=bert,
        hidden_size=bert.hidden_size,
        pooling=method,  # type: ignore[arg-type]
        attention="bidirectional",
        normalize=_has_normalize(path),
        max_seq_length=max_len,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
    )
