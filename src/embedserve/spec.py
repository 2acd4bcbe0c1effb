"""What a model folder says about the model: architecture, shapes, pooling, limits, prompts.

Read once from a local Hugging Face / sentence-transformers folder and validated in one place,
so every later layer can trust it.

What decides attention and pooling for a Qwen3 folder (docs/models.md has the full list):

- attention: `causal` unless config.json says `"is_causal": false` or
  `"use_bidirectional_attention": true` (or `embedserve.json` says `"attention": ...`);
  `read_model_spec(..., attention=)` overrides.
- pooling: the sentence-transformers `1_Pooling/config.json` when present, else `last` for causal
  and `mean` for bidirectional; `read_model_spec(..., pooling=)` overrides.
- native output (`embedserve.json`): `"output_rules": "pplx"` switches int8/binary to the
  Perplexity rules in `outputs`, `"default_output_dtype"` sets the default encoding.

What makes a folder a scoring model (task "score": one relevance score per query/document pair):

- `BertForSequenceClassification` with one label: a cross-encoder (`[CLS] query [SEP] document
  [SEP]`, the pooler and classifier on CLS). Its activation is sentence-transformers
  CrossEncoder's: config.json `sentence_transformers.activation_fn` (or the older
  `sbert_ce_default_activation_function`), else sigmoid.
- `Qwen3ForCausalLM` without sentence-transformers modules (as Qwen3-Reranker ships), or any
  Qwen3 folder whose `embedserve.json` says `"task": "score"`: an LLM reranker, score = softmax
  of the "yes" and "no" logits at the last token (only those two rows of the output projection
  are loaded). `"task": "embed"` makes such a folder an embedder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

PoolingMethod = Literal["mean", "cls", "last"]
Task = Literal["embed", "score"]
ScoreKind = Literal["classifier", "yes_no"]
Activation = Literal["sigmoid", "identity"]
AttentionKind = Literal["bidirectional", "causal"]
OutputRules = Literal["generic", "pplx"]

POOLING_METHODS: tuple[str, ...] = ("mean", "cls", "last")
ATTENTION_KINDS: tuple[str, ...] = ("causal", "bidirectional")
OUTPUT_RULES: tuple[str, ...] = ("generic", "pplx")

# config.json "architectures" / "model_type" values this engine can run, by family.
BERT_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining")
BERT_SCORE_ARCHITECTURES = ("BertForSequenceClassification",)
QWEN3_ARCHITECTURES = ("Qwen3Model", "Qwen3ForCausalLM")
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    BERT_ARCHITECTURES + BERT_SCORE_ARCHITECTURES + QWEN3_ARCHITECTURES
)
TASKS: tuple[str, ...] = ("embed", "score")
# the answer tokens of an LLM reranker (Qwen3-Reranker's prompt asks for "yes" or "no")
YES_NO_TOKENS = ("yes", "no")

# Our own optional file in a model folder, for what Hugging Face configs have no key for.
EMBEDSERVE_CONFIG = "embedserve.json"


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
class Qwen3Config:
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


@dataclass(frozen=True)
class ScoreSpec:
    """How a scoring model turns a pair into a relevance score."""

    kind: ScoreKind  # "classifier": BERT pooler + classifier on CLS; "yes_no": an LLM's answer
    activation: Activation  # applied to the raw score (logit; yes - no logits for "yes_no")
    yes_no_ids: tuple[int, int] | None = None  # "yes_no": the token ids of "yes" and "no"

    def activate(self, raw: Any) -> Any:
        """Raw scores (logits) -> relevance scores, float32 (a NumPy array)."""
        import numpy as np

        from embedserve.outputs import sigmoid  # numpy only

        raw = np.asarray(raw, dtype=np.float64)
        return raw.astype(np.float32) if self.activation == "identity" else sigmoid(raw)


@dataclass(frozen=True)
class ModelSpec:
    """Everything the engine and the tokenizer side need to know about one model folder."""

    path: Path
    family: Literal["bert", "qwen3"]
    architecture: str
    bert: BertConfig | None  # set for family "bert"
    hidden_size: int
    pooling: PoolingMethod
    attention: AttentionKind
    normalize: bool  # the folder ends in a Normalize module: outputs are unit vectors by default
    max_seq_length: int  # tokens per sequence, special tokens included
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    qwen3: Qwen3Config | None = None  # set for family "qwen3"
    output_rules: OutputRules = "generic"  # how int8/binary are computed (see outputs)
    default_output_dtype: str = "float32"  # the encoding when a request names none
    task: Task = "embed"
    score: ScoreSpec | None = None  # set for task "score"

    @property
    def output_width(self) -> int:
        """Columns of a row the engine returns: the hidden size, or 1 (the raw score)."""
        return 1 if self.task == "score" else self.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.bert.vocab_size if self.bert else self._qwen3.vocab_size

    @property
    def max_position_embeddings(self) -> int:
        return (
            self.bert.max_position_embeddings if self.bert else self._qwen3.max_position_embeddings
        )

    @property
    def type_vocab_size(self) -> int:
        """Segment ids the model has embeddings for (1 for models without token types)."""
        return self.bert.type_vocab_size if self.bert else 1

    @property
    def _qwen3(self) -> Qwen3Config:
        if self.qwen3 is None:
            raise ValueError(f"{self.path}: spec has neither a BERT nor a Qwen3 config")
        return self.qwen3


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
            # sentence-transformers 6 writes one "pooling_mode"; older versions one flag per mode
            mode = pool_cfg.get("pooling_mode")
            if mode in ("mean", "cls"):
                return mode
            if mode == "lasttoken":
                return "last"
            if mode is not None:
                raise ModelLoadError(
                    f"{pool_cfg_path}: unsupported pooling_mode {mode!r}; "
                    "expected mean, cls or lasttoken"
                )
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


def _read_bert(cfg: dict[str, Any], config_path: Path) -> BertConfig:
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
    return bert


def _read_qwen3(cfg: dict[str, Any], config_path: Path) -> Qwen3Config:
    # transformers 5 writes rope settings under "rope_parameters"; older configs at the top level.
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ModelLoadError(
            f"{config_path}: rope_type {rope_type!r} is not supported; expected 'default'"
        )
    if cfg.get("use_sliding_window"):
        raise ModelLoadError(f"{config_path}: use_sliding_window is not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{config_path}: unsupported hidden_act {cfg['hidden_act']!r}")
    hidden = int(_require(cfg, "hidden_size", config_path))
    heads = int(_require(cfg, "num_attention_heads", config_path))
    qwen3 = Qwen3Config(
        vocab_size=int(_require(cfg, "vocab_size", config_path)),
        hidden_size=hidden,
        num_layers=int(_require(cfg, "num_hidden_layers", config_path)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(_require(cfg, "intermediate_size", config_path)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        attention_bias=bool(cfg.get("attention_bias", False)),
    )
    if qwen3.num_heads % qwen3.num_kv_heads:
        raise ModelLoadError(
            f"{config_path}: num_attention_heads {qwen3.num_heads} is not a multiple of "
            f"num_key_value_heads {qwen3.num_kv_heads}"
        )
    if qwen3.head_dim % 2:
        raise ModelLoadError(f"{config_path}: head_dim {qwen3.head_dim} must be even for rotary")
    return qwen3


def _declared_attention(
    cfg: dict[str, Any], extra: dict[str, Any], config_path: Path
) -> AttentionKind | None:
    """The attention kind a folder declares, if any (see the module docstring)."""
    if "attention" in extra:
        kind = extra["attention"]
        if kind not in ATTENTION_KINDS:
            raise ModelLoadError(
                f"{config_path.parent / EMBEDSERVE_CONFIG}: attention {kind!r} is not one of "
                f"{', '.join(ATTENTION_KINDS)}"
            )
        return kind
    if cfg.get("is_causal") is False or cfg.get("use_bidirectional_attention") is True:
        return "bidirectional"
    if cfg.get("is_causal") is True:
        return "causal"
    return None


def read_model_spec(
    folder: str | Path,
    *,
    pooling: str | None = None,
    attention: str | None = None,
) -> ModelSpec:
    """Read and validate a model folder.

    `pooling` and `attention` ("causal" | "bidirectional") override what the folder declares.
    """
    path = Path(folder)
    if not path.is_dir():
        raise ModelLoadError(f"{path}: not a directory (expected a model folder with config.json)")
    config_path = path / "config.json"
    cfg = _read_json(config_path)
    architectures = cfg.get("architectures") or []
    arch = architectures[0] if architectures else cfg.get("model_type", "<none>")
    model_type = cfg.get("model_type")
    if model_type == "qwen3" or arch in QWEN3_ARCHITECTURES:
        family = "qwen3"
    elif model_type == "bert" or arch in BERT_ARCHITECTURES + BERT_SCORE_ARCHITECTURES:
        family = "bert"
    else:
        raise ModelLoadError(
            f"{config_path}: unsupported architecture {arch!r} (model_type {model_type!r}); "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)} (model_type bert or qwen3)"
        )
    if attention is not None and attention not in ATTENTION_KINDS:
        raise ValueError(f"attention {attention!r} is not one of {', '.join(ATTENTION_KINDS)}")
    extra_path = path / EMBEDSERVE_CONFIG
    extra: dict[str, Any] = _read_json(extra_path) if extra_path.exists() else {}
    if not isinstance(extra, dict):
        raise ModelLoadError(f"{extra_path}: expected a JSON object")

    bert: BertConfig | None = None
    qwen3: Qwen3Config | None = None
    task = _task(path, family, arch, extra)
    score: ScoreSpec | None = None
    if family == "bert":
        bert = _read_bert(cfg, config_path)
        kind: str = attention or "bidirectional"
        if kind != "bidirectional":
            raise ValueError("BERT models only run with bidirectional attention")
        hidden, max_len = bert.hidden_size, bert.max_position_embeddings
        default_pooling = "cls"
        if task == "score":
            score = ScoreSpec("classifier", _classifier_activation(cfg, config_path))
    else:
        qwen3 = _read_qwen3(cfg, config_path)
        kind = attention or _declared_attention(cfg, extra, config_path) or "causal"
        hidden, max_len = qwen3.hidden_size, qwen3.max_position_embeddings
        default_pooling = "last" if kind == "causal" else "mean"
        if task == "score":
            score = ScoreSpec("yes_no", "sigmoid", _yes_no_ids(path))

    declared = _pooling_from_folder(path)
    if task == "score":
        # the pair's score is read at one token: BERT's CLS (through its pooler), an LLM's last
        declared, default_pooling = None, "cls" if family == "bert" else "last"
        if pooling is not None and pooling != default_pooling:
            raise ValueError(f"a scoring model pools {default_pooling!r}; got pooling {pooling!r}")
    method = pooling or declared or default_pooling
    if method not in POOLING_METHODS:
        raise ValueError(f"pooling {method!r} is not one of {', '.join(POOLING_METHODS)}")

    st_cfg_path = path / "sentence_bert_config.json"
    if st_cfg_path.exists():
        max_len = min(max_len, int(_read_json(st_cfg_path).get("max_seq_length") or max_len))

    prompts: dict[str, str] = {}
    default_prompt_name = None
    prompt_cfg_path = path / "config_sentence_transformers.json"
    if prompt_cfg_path.exists():
        prompt_cfg = _read_json(prompt_cfg_path)
        prompts = {str(k): str(v) for k, v in (prompt_cfg.get("prompts") or {}).items()}
        default_prompt_name = prompt_cfg.get("default_prompt_name")

    rules = extra.get("output_rules", "generic")
    if rules not in OUTPUT_RULES:
        raise ModelLoadError(
            f"{extra_path}: output_rules {rules!r} is not one of {', '.join(OUTPUT_RULES)}"
        )
    default_dtype = str(extra.get("default_output_dtype", "float32"))
    from embedserve.outputs import OUTPUT_DTYPES  # numpy only, no torch

    if default_dtype not in OUTPUT_DTYPES:
        raise ModelLoadError(
            f"{extra_path}: default_output_dtype {default_dtype!r} is not one of "
            f"{', '.join(OUTPUT_DTYPES)}"
        )

    return ModelSpec(
        path=path,
        family=family,  # type: ignore[arg-type]
        architecture=arch,
        bert=bert,
        hidden_size=hidden,
        pooling=method,  # type: ignore[arg-type]
        attention=kind,  # type: ignore[arg-type]
        normalize=_has_normalize(path),
        max_seq_length=max_len,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        qwen3=qwen3,
        output_rules=rules,
        default_output_dtype=default_dtype,
        task=task,
        score=score,
    )


def _task(path: Path, family: str, arch: str, extra: dict[str, Any]) -> Task:
    """embed or score (see the module docstring)."""
    if "task" in extra:
        task = extra["task"]
        if task not in TASKS:
            raise ModelLoadError(
                f"{path / EMBEDSERVE_CONFIG}: task {task!r} is not one of {', '.join(TASKS)}"
            )
        if family == "bert" and (task == "score") != (arch in BERT_SCORE_ARCHITECTURES):
            raise ModelLoadError(
                f"{path / EMBEDSERVE_CONFIG}: task {task!r} does not fit architecture {arch!r}"
            )
        return task
    if arch in BERT_SCORE_ARCHITECTURES:
        return "score"
    if arch == "Qwen3ForCausalLM" and not (path / "modules.json").exists():
        return "score"
    return "embed"


def _classifier_activation(cfg: dict[str, Any], config_path: Path) -> Activation:
    """A cross-encoder's activation, as sentence-transformers CrossEncoder reads it."""
    labels = cfg.get("id2label")
    num_labels = len(labels) if isinstance(labels, dict) else int(cfg.get("num_labels", 2))
    if num_labels != 1:
        raise ModelLoadError(
            f"{config_path}: a sequence classifier with {num_labels} labels cannot rank; "
            "a reranker has one (a relevance logit)"
        )
    name = (cfg.get("sentence_transformers") or {}).get("activation_fn") or cfg.get(
        "sbert_ce_default_activation_function"
    )
    if name is None or str(name).endswith("Sigmoid"):
        return "sigmoid"
    if str(name).endswith("Identity"):
        return "identity"
    raise ModelLoadError(
        f"{config_path}: activation {name!r} is not supported; expected Sigmoid or Identity"
    )


def _yes_no_ids(path: Path) -> tuple[int, int]:
    """The token ids of "yes" and "no" in the folder's tokenizer (an LLM reranker's answers)."""
    from tokenizers import Tokenizer  # no torch

    tokenizer_path = path / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    except Exception as e:  # tokenizers raises a bare Exception
        raise ModelLoadError(f"{tokenizer_path}: cannot read the tokenizer ({e})") from None
    ids = [tokenizer.token_to_id(t) for t in YES_NO_TOKENS]
    if None in ids:
        raise ModelLoadError(f"{tokenizer_path}: no single token for 'yes' and 'no'")
    return ids[0], ids[1]  # type: ignore[return-value]
