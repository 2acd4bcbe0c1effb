"""What a model folder says about the model: architecture, shapes, pooling, limits, prompts.

Read once from a local Hugging Face / sentence-transformers folder and validated in one place,
so every later layer can trust it. Which family a folder is, and its config, come from
`families`; the encoder families are bidirectional and pool as their sentence-transformers
Pooling module says (else the family's default).

What decides attention and pooling for a Qwen3 folder (docs/models.md has the full list):

- attention: `causal` unless config.json says `"is_causal": false` or
  `"use_bidirectional_attention": true` (or `embedserve.json` says `"attention": ...`);
  `read_model_spec(..., attention=)` overrides.
- pooling: the sentence-transformers `1_Pooling/config.json` when present, else `last` for causal
  and `mean` for bidirectional; `read_model_spec(..., pooling=)` overrides.
- native output (`embedserve.json`): `"output_rules": "pplx"` switches int8/binary to the
  Perplexity rules in `outputs`, `"default_output_dtype"` sets the default encoding.

What makes a folder a scoring model (task "score": one relevance score per query/document pair):

- `BertForSequenceClassification` (or `XLMRobertaForSequenceClassification`) with one label: a
  cross-encoder (`[CLS] query [SEP] document [SEP]`, the pooler and classifier on CLS). Its activation is sentence-transformers
  CrossEncoder's: config.json `sentence_transformers.activation_fn` (or the older
  `sbert_ce_default_activation_function`), else sigmoid.
- `Qwen3ForCausalLM` without sentence-transformers modules (as Qwen3-Reranker ships), or any
  Qwen3 folder whose `embedserve.json` says `"task": "score"`: an LLM reranker, score = softmax
  of the "yes" and "no" logits at the last token (only those two rows of the output projection
  are loaded). `"task": "embed"` makes such a folder an embedder.

A `*ForSequenceClassification` folder with two labels or more is a classifier (task "classify":
one probability per label, `labels`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from embedserve.loading.families import (
    FAMILIES,
    FAMILY_BY_NAME,
    SUPPORTED_ARCHITECTURES,
    AttentionKind,
    Family,
    PoolingMethod,
    ScoreKind,
    family_of,
)
from embedserve.loading.family_configs import BertConfig, FamilyConfig, ModelLoadError, Qwen3Config
from embedserve.loading.labels import (
    LabelSpec,
    cross_encoder_activation,
    num_labels,
    read_labels,
    sigmoid,
)
from embedserve.loading.retrieval import Output, RetrievalSpec
from embedserve.loading.retrieval_kinds import KIND_BY_NAME, read_retrieval
from embedserve.loading.score_readers import answer_ids

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "BertConfig",
    "ModelLoadError",
    "ModelSpec",
    "Qwen3Config",
    "read_model_spec",
]

Task = Literal["embed", "score", "classify"]
Activation = Literal["sigmoid", "identity"]
OutputRules = Literal["generic", "pplx"]

POOLING_METHODS: tuple[str, ...] = ("mean", "cls", "last")
ATTENTION_KINDS: tuple[str, ...] = ("causal", "bidirectional")
OUTPUT_RULES: tuple[str, ...] = ("generic", "pplx")
# the encodings of a vector (`core.head` applies them; a folder may name its default)
OUTPUT_DTYPES: tuple[str, ...] = ("float32", "float16", "int8", "uint8", "binary", "ubinary")

TASKS: tuple[str, ...] = ("embed", "score", "classify")
# the architectures that only score pairs (cross-encoders with a one-label classifier); a
# language model that scores by its logits embeds as well, and its folder decides
SCORE_ARCHITECTURES: tuple[str, ...] = tuple(
    a for f in FAMILIES if not f.scores_by_logits for a in f.score_architectures
)

# Our own optional file in a model folder, for what Hugging Face configs have no key for.
EMBEDSERVE_CONFIG = "embedserve.json"


@dataclass(frozen=True)
class ScoreSpec:
    """How a scoring model turns a pair into a relevance score."""

    kind: ScoreKind  # "classifier": BERT pooler + classifier on CLS; "yes_no": an LLM's answer
    activation: Activation  # applied to the raw score (logit; yes - no logits for "yes_no")
    yes_no_ids: tuple[int, int] | None = None  # "yes_no": the token ids of "yes" and "no"

    def activate(self, raw: Any) -> Any:
        """Raw scores (logits) -> relevance scores, float32 (a NumPy array)."""
        import numpy as np

        raw = np.asarray(raw, dtype=np.float64)
        return raw.astype(np.float32) if self.activation == "identity" else sigmoid(raw)


@dataclass(frozen=True)
class DenseLayer:
    """A sentence-transformers `Dense` module after pooling: y = act(x W^T + b)."""

    path: str  # the module's folder inside the model folder
    in_features: int
    out_features: int
    bias: bool
    activation: Literal["identity", "tanh"]


@dataclass(frozen=True)
class ModelSpec:
    """Everything the engine and the tokenizer side need to know about one model folder."""

    path: Path
    family: str  # a `families.FAMILIES` name
    architecture: str
    config: FamilyConfig  # the family's config (shapes, positions, norms)
    hidden_size: int  # the width of an embedding: the model's, or the last Dense module's
    pooling: PoolingMethod
    attention: AttentionKind
    normalize: bool  # the folder ends in a Normalize module: outputs are unit vectors by default
    max_seq_length: int  # tokens per sequence, special tokens included
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    output_rules: OutputRules = "generic"  # how int8/binary are computed (see outputs)
    default_output_dtype: str = "float32"  # the encoding when a request names none
    task: Task = "embed"
    score: ScoreSpec | None = None  # set for task "score"
    dense: tuple[DenseLayer, ...] = ()  # sentence-transformers Dense modules, in order
    labels: LabelSpec | None = None  # set for task "classify"
    retrieval: RetrievalSpec | None = None  # SPLADE / bge-m3 / ColBERT heads (`retrieval`)
    outputs: tuple[Output, ...] = ("dense",)  # what it embeds: dense, sparse, multivector

    @property
    def output_width(self) -> int:
        """Columns of a row the engine returns: the embedding width, 1 (the raw score), or a
        classifier's labels (their logits)."""
        if self.labels is not None:
            return self.labels.num_labels
        return 1 if self.task == "score" else self.hidden_size

    @property
    def family_row(self) -> Family:
        """The family's row of the registry: its model, attention kernels, score head."""
        return FAMILY_BY_NAME[self.family]

    @property
    def bert(self) -> BertConfig | None:
        return self.config if isinstance(self.config, BertConfig) else None

    @property
    def qwen3(self) -> Qwen3Config | None:
        return self.config if isinstance(self.config, Qwen3Config) else None

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_position_embeddings(self) -> int:
        """Tokens per sequence the model has positions for (after any offset)."""
        return self.config.max_positions

    @property
    def type_vocab_size(self) -> int:
        """Segment ids the model has embeddings for (1 for models without token types)."""
        return int(getattr(self.config, "type_vocab_size", 1))


def _read_json(path: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None


def _pooling_from_folder(folder: Path) -> PoolingMethod | None:
    """The pooling method declared by a sentence-transformers folder, if any."""
    modules_path = folder / "modules.json"
    if not modules_path.exists():
        return None
    for module in _read_json(modules_path):
        if module.get("type", "").endswith(".Pooling"):  # not SpladePooling
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
    """Read and validate a model folder; `pooling` and `attention` ("causal" | "bidirectional")
    override what the folder declares."""
    path = Path(folder)
    if not path.is_dir():
        raise ModelLoadError(f"{path}: not a directory (expected a model folder with config.json)")
    config_path = path / "config.json"
    cfg = _read_json(config_path)
    family, arch = family_of(cfg, config_path)
    if attention is not None and attention not in ATTENTION_KINDS:
        raise ValueError(f"attention {attention!r} is not one of {', '.join(ATTENTION_KINDS)}")
    extra_path = path / EMBEDSERVE_CONFIG
    extra: dict[str, Any] = _read_json(extra_path) if extra_path.exists() else {}
    if not isinstance(extra, dict):
        raise ModelLoadError(f"{extra_path}: expected a JSON object")
    config = family.read_config(cfg, config_path)
    task = _task(path, family, arch, extra, cfg)
    kind = _attention_kind(family, attention, cfg, extra, config_path)
    score: ScoreSpec | None = None
    if task == "score" and family.scores_by_logits:
        score = ScoreSpec("yes_no", "sigmoid", answer_ids(path, family.answer_tokens))
    elif task == "score":
        score = ScoreSpec("classifier", cross_encoder_activation(cfg, config_path))
    method = _pooling(path, family, kind, task, pooling)
    max_len, prompts, default_prompt_name = _sentence_transformers(path, config.max_positions)
    rules, default_dtype = _output_defaults(extra, extra_path)
    retrieval = read_retrieval(path, family.marker, config.hidden_size) if family.marker else None
    # a ColBERT folder's Dense modules project every token (its own head), not a pooled vector
    token_dense = bool(family.marker) and KIND_BY_NAME[family.marker].token_dense
    dense = () if token_dense else _dense_layers(path, config.hidden_size)
    if dense and task != "embed":
        raise ModelLoadError(f"{path / 'modules.json'}: a {task} model has no Dense modules")
    return ModelSpec(
        path=path,
        family=family.name,
        architecture=arch,
        config=config,
        hidden_size=dense[-1].out_features if dense else config.hidden_size,
        pooling=method,
        attention=kind,
        normalize=_has_normalize(path),
        max_seq_length=max_len,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        output_rules=rules,
        default_output_dtype=default_dtype,
        task=task,
        score=score,
        dense=dense,
        labels=read_labels(cfg, config_path) if task == "classify" else None,
        retrieval=retrieval,
        outputs=retrieval.outputs if retrieval else () if task != "embed" else ("dense",),
    )


def _attention_kind(
    family: Family,
    attention: str | None,
    cfg: dict[str, Any],
    extra: dict[str, Any],
    config_path: Path,
) -> AttentionKind:
    """The kind asked for, else the folder's (see the module docstring), else the family's
    default; a family that runs one kind refuses another."""
    kinds = family.attention_kinds
    if len(kinds) > 1:
        kind = attention or _declared_attention(cfg, extra, config_path) or kinds[0]
        return kind  # type: ignore[return-value]
    if (attention or kinds[0]) != kinds[0]:
        raise ValueError(f"{family.name} models only run with {kinds[0]} attention")
    declared = _declared_attention(cfg, extra, config_path)
    if family.undeclared_attention and (attention or declared) != kinds[0]:
        raise ModelLoadError(f"{config_path}: {family.undeclared_attention}")
    return kinds[0]


def _pooling(
    path: Path, family: Family, kind: str, task: Task, pooling: str | None
) -> PoolingMethod:
    """The pooling asked for, else the folder's Pooling module's, else the family's default; a
    scoring model reads its pair's score at one token, and pools nothing else."""
    declared = _pooling_from_folder(path)
    default = family.default_pooling(kind)
    if task != "embed":  # a classifier's head is a cross-encoder's
        declared, default = None, family.score_pooling
        if pooling is not None and pooling != default:
            raise ValueError(f"a scoring model pools {default!r}; got pooling {pooling!r}")
    method = pooling or declared or default
    if method not in POOLING_METHODS:
        raise ValueError(f"pooling {method!r} is not one of {', '.join(POOLING_METHODS)}")
    return method  # type: ignore[return-value]


def _sentence_transformers(path: Path, max_positions: int) -> tuple[int, dict[str, str], Any]:
    """(tokens per sequence: the model's positions, or fewer where sentence-transformers says so;
    its prompts by name; the default prompt's name)."""
    max_len, st_cfg_path = max_positions, path / "sentence_bert_config.json"
    if st_cfg_path.exists():
        max_len = min(max_len, int(_read_json(st_cfg_path).get("max_seq_length") or max_len))
    prompt_cfg_path = path / "config_sentence_transformers.json"
    if not prompt_cfg_path.exists():
        return max_len, {}, None
    prompt_cfg = _read_json(prompt_cfg_path)
    prompts = {str(k): str(v) for k, v in (prompt_cfg.get("prompts") or {}).items()}
    return max_len, prompts, prompt_cfg.get("default_prompt_name")


def _output_defaults(extra: dict[str, Any], extra_path: Path) -> tuple[OutputRules, str]:
    """embedserve.json's native output: the int8/binary rules and the default encoding."""
    rules = extra.get("output_rules", "generic")
    if rules not in OUTPUT_RULES:
        raise ModelLoadError(
            f"{extra_path}: output_rules {rules!r} is not one of {', '.join(OUTPUT_RULES)}"
        )
    default_dtype = str(extra.get("default_output_dtype", "float32"))
    if default_dtype not in OUTPUT_DTYPES:
        raise ModelLoadError(
            f"{extra_path}: default_output_dtype {default_dtype!r} is not one of "
            f"{', '.join(OUTPUT_DTYPES)}"
        )
    return rules, default_dtype


def _dense_layers(folder: Path, hidden: int) -> tuple[DenseLayer, ...]:
    """The sentence-transformers Dense modules of the folder, in order, their widths chained
    from the model's hidden size."""
    modules_path = folder / "modules.json"
    if not modules_path.exists():
        return ()
    layers: list[DenseLayer] = []
    width = hidden
    for module in _read_json(modules_path):
        if not str(module.get("type", "")).endswith(".Dense"):
            continue
        sub = str(module.get("path", ""))
        cfg_path = folder / sub / "config.json"
        cfg = _read_json(cfg_path)
        act = str(cfg.get("activation_function", "torch.nn.modules.linear.Identity"))
        activation = (
            "identity" if act.endswith("Identity") else "tanh" if act.endswith("Tanh") else None
        )
        if activation is None:
            raise ModelLoadError(f"{cfg_path}: activation_function {act!r} is not supported")
        layer = DenseLayer(
            path=sub,
            in_features=int(cfg.get("in_features", 0)),
            out_features=int(cfg.get("out_features", 0)),
            bias=bool(cfg.get("bias", True)),
            activation=activation,  # type: ignore[arg-type]
        )
        if layer.in_features != width or layer.out_features <= 0:
            raise ModelLoadError(
                f"{cfg_path}: in_features {layer.in_features} / out_features "
                f"{layer.out_features} do not follow a width of {width}"
            )
        layers.append(layer)
        width = layer.out_features
    return tuple(layers)


def _task(path: Path, family: Family, arch: str, extra: dict[str, Any], cfg: Any) -> Task:
    """embed, score or classify (see the module docstring)."""
    only_scores = arch in SCORE_ARCHITECTURES
    if "task" in extra:
        task = extra["task"]
        if task not in TASKS:
            raise ModelLoadError(
                f"{path / EMBEDSERVE_CONFIG}: task {task!r} is not one of {', '.join(TASKS)}"
            )
        if not family.scores_by_logits and (task != "embed") != only_scores:
            raise ModelLoadError(
                f"{path / EMBEDSERVE_CONFIG}: task {task!r} does not fit architecture {arch!r}"
            )
        return task
    if only_scores and not family.scores_by_logits:
        return "score" if num_labels(cfg) == 1 else "classify"
    if (
        family.scores_by_logits
        and arch in family.score_architectures
        and not (path / "modules.json").exists()
    ):
        return "score"
    return "embed"
