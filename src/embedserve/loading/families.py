"""The one registry of the model families this engine runs: a row per family says how a folder is
recognised, which reader validates its config.json, which engine model runs it, how it attends
and pools, and how it scores pairs. `embedserve models` prints the table (docs/models.md has it).

Adding a family is one row here and one model file under `engine/models/` (named by the row's
`model`, a dotted path, so this module never imports torch: the gateway and the CLI read model
folders with it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

from embedserve.loading.family_configs import (
    FamilyConfig,
    ModelLoadError,
    read_bert,
    read_gemma3,
    read_modernbert,
    read_nomic_bert,
    read_qwen3,
)
from embedserve.loading.retrieval_kinds import KIND_BY_NAME

PoolingMethod = Literal["mean", "cls", "last"]
AttentionKind = Literal["bidirectional", "causal"]
ScoreKind = Literal["classifier", "yes_no"]

# checkpoint names of a cross-encoder's head (after `tensor_names.canonical`): (its pooler's
# prefixes, its classifier's), each tried in order; BERT's pooler, then `classifier`
BERT_CLASSIFIER = (("pooler.dense.",), ("classifier.",))
# RoBERTa's classification head: its own dense + tanh on <s>, then `out_proj`
ROBERTA_CLASSIFIER = (("classifier.dense.",), ("classifier.out_proj.",))
# BertEncoder runs BERT and RoBERTa folders alike: either one's base-model prefix
BERT_PREFIXES = ("bert.", "roberta.", "model.")


@dataclass(frozen=True)
class Family:
    """One row of the registry (see the module docstring)."""

    name: str
    model_types: tuple[str, ...]  # config.json "model_type"
    embed_architectures: tuple[str, ...]  # config.json "architectures" that embed
    score_architectures: tuple[str, ...]  # ... that score pairs
    read_config: Callable[[dict[str, Any], Path], FamilyConfig]
    model: str  # "module:Class" of the engine model (imported by the engine only)
    examples: str
    notes: str = ""
    # the attention kinds it runs, the first the default, each with its pooling when the folder
    # has no sentence-transformers Pooling module
    pooling_default: tuple[tuple[AttentionKind, PoolingMethod], ...] = (("bidirectional", "cls"),)
    attention_note: str = ""  # for the table: the layers' windows
    # set when a folder must declare bidirectional attention (else it is a language model): why
    # one that does not is refused
    undeclared_attention: str = ""
    # it adds a per-head score bias to attention: only kernels that take one may run it
    score_bias: bool = False
    # attention kernels (`engine.attention.BACKENDS` names) it runs best on, in order: the first
    # is its eager kernel on CUDA and always a graph candidate, the others graph candidates where
    # configured; empty: the device's defaults
    kernels: tuple[str, ...] = ()
    # the tokenizer rule of a language model that scores a pair by the logits of its answer
    # tokens ("yes", "no": their ids read from the folder's tokenizer.json) at the last token;
    # empty for a cross-encoder. Such a score architecture embeds as well, so the folder decides
    # (no sentence-transformers modules, or embedserve.json "task": "score").
    answer_tokens: tuple[str, ...] = ()
    classifier_tensors: tuple[tuple[str, ...], tuple[str, ...]] = BERT_CLASSIFIER
    # a retrieval kind on another family's encoder (its row of `retrieval_kinds`: splade,
    # bge-m3, colbert): the row applies to a folder of its model_types only when that kind's
    # `detect` finds it
    marker: str = ""
    # the base-model prefixes its task models save the encoder under (transformers'
    # `base_model_prefix`, then older ones), dropped from checkpoint names (`tensor_names`)
    prefixes: tuple[str, ...] = ("model.",)

    @property
    def attention_kinds(self) -> tuple[AttentionKind, ...]:
        return tuple(kind for kind, _ in self.pooling_default)

    def default_pooling(self, attention: str) -> PoolingMethod:
        return dict(self.pooling_default)[attention]  # type: ignore[index]

    @property
    def scores_by_logits(self) -> bool:
        return bool(self.answer_tokens)

    @property
    def score_kind(self) -> ScoreKind:
        """How its scoring architectures score: an LLM's answer or a classifier on CLS."""
        return "yes_no" if self.scores_by_logits else "classifier"

    @property
    def score_pooling(self) -> PoolingMethod:
        """The one token a pair's score is read at: an LLM's last, a cross-encoder's CLS."""
        return "last" if self.scores_by_logits else "cls"


FAMILIES: tuple[Family, ...] = (
    Family(
        "bert",
        ("bert",),
        ("BertModel", "BertForMaskedLM", "BertForPreTraining"),
        ("BertForSequenceClassification",),
        read_bert,
        "embedserve.engine.models.bert:BertEncoder",
        "all-MiniLM-L6-v2, bge-*-en-v1.5, e5-*-v2, gte-small, multilingual-e5-small, "
        "ms-marco-MiniLM cross-encoders",
        prefixes=BERT_PREFIXES,
    ),
    Family(
        "xlm-roberta",
        ("xlm-roberta", "roberta"),
        ("XLMRobertaModel", "XLMRobertaForMaskedLM", "RobertaModel", "RobertaForMaskedLM"),
        ("XLMRobertaForSequenceClassification", "RobertaForSequenceClassification"),
        partial(read_bert, roberta=True),
        "embedserve.engine.models.bert:BertEncoder",
        "multilingual-e5-base / -large, bge-m3 (dense), bge-reranker-v2-m3, roberta-base",
        "positions start at padding_idx + 1; no token types",
        classifier_tensors=ROBERTA_CLASSIFIER,
        prefixes=BERT_PREFIXES,
    ),
    Family(
        "mpnet",
        ("mpnet",),
        ("MPNetModel", "MPNetForMaskedLM"),
        (),
        partial(read_bert, mpnet=True),
        "embedserve.engine.models.mpnet:MPNetEncoder",
        "all-mpnet-base-v2, multi-qa-mpnet-base-dot-v1",
        "relative position bias (no FlashAttention: the padded SDPA backend on CUDA)",
        pooling_default=(("bidirectional", "mean"),),
        score_bias=True,
        # padded first: it runs at any size (S L², not T²); the masked ones are timed where a
        # bucket is small or holds one sequence
        kernels=("padded", "cudnn", "block_mask"),
        prefixes=("mpnet.", "model."),
    ),
    Family(
        "nomic-bert",
        ("nomic_bert",),
        ("NomicBertModel", "NomicBertForMaskedLM", "NomicBertForPreTraining"),
        (),
        read_nomic_bert,
        "embedserve.engine.models.nomic_bert:NomicBertEncoder",
        "nomic-embed-text-v1 / v1.5",
        "rotary, SwiGLU; prompts search_query: / search_document:",
        pooling_default=(("bidirectional", "mean"),),
        # transformers' NomicBertFor*, then nomic's remote code
        prefixes=("nomic_bert.", "bert.", "model."),
    ),
    Family(
        "modernbert",
        ("modernbert",),
        ("ModernBertModel", "ModernBertForMaskedLM"),
        (),
        read_modernbert,
        "embedserve.engine.models.modernbert:ModernBertEncoder",
        "gte-modernbert-base, modernbert-embed-base",
        "rotary, GeGLU, no biases",
        attention_note="local window on 2 of 3 layers",
    ),
    Family(
        "gemma3",
        ("gemma3_text",),
        ("Gemma3TextModel", "Gemma3ForCausalLM"),
        (),
        read_gemma3,
        "embedserve.engine.models.gemma3:Gemma3Encoder",
        "EmbeddingGemma-300m",
        "GQA; Dense projections after pooling from the sentence-transformers folder",
        pooling_default=(("bidirectional", "mean"),),
        attention_note="sliding window on 5 of 6 layers",
        undeclared_attention='a Gemma 3 without "use_bidirectional_attention": true is a '
        "causal language model; embedserve runs Gemma 3 as EmbeddingGemma does, "
        'bidirectionally (say so in config.json, or pass attention="bidirectional")',
        # Gemma3ForConditionalGeneration's text model, before and since transformers 4.52
        prefixes=("model.language_model.", "language_model.model.", "model."),
    ),
    Family(
        "qwen3",
        ("qwen3",),
        ("Qwen3Model", "Qwen3ForCausalLM"),
        ("Qwen3ForCausalLM",),
        read_qwen3,
        "embedserve.engine.models.qwen3:Qwen3Encoder",
        "Qwen3-Embedding-*, Qwen3-Reranker-* (yes/no), pplx-embed",
        "a Qwen3ForCausalLM folder without sentence-transformers modules is a reranker",
        pooling_default=(("causal", "last"), ("bidirectional", "mean")),
        answer_tokens=("yes", "no"),
        # Qwen3ForQuestionAnswering keeps the older `transformer`
        prefixes=("model.", "transformer."),
    ),
)

# The retrieval layouts: each is a folder of a family above (its encoder, its model file) plus
# the heads of its outputs (`retrieval`), recognised by its marker before the plain family.
RETRIEVAL_FAMILIES: tuple[Family, ...] = (
    Family(
        "splade",
        ("bert",),
        ("BertForMaskedLM",),
        (),
        read_bert,
        "embedserve.engine.models.bert:BertEncoder",
        "naver/splade-v3, naver/splade-cocondenser-ensembledistil",
        "sentence-transformers SparseEncoder folder (MLMTransformer + SpladePooling); "
        "log(1 + ReLU(MLM logits)) pooled per input in token blocks",
        marker="splade",
        prefixes=BERT_PREFIXES,
    ),
    Family(
        "bge-m3",
        ("xlm-roberta",),
        ("XLMRobertaModel",),
        (),
        partial(read_bert, roberta=True),
        "embedserve.engine.models.bert:BertEncoder",
        "BAAI/bge-m3",
        "sparse_linear.pt + colbert_linear.pt beside the encoder; dense, sparse and "
        "multi-vector from one forward",
        marker="bge-m3",
        prefixes=BERT_PREFIXES,
    ),
    Family(
        "colbert",
        ("bert",),
        ("BertModel", "BertForMaskedLM"),
        (),
        read_bert,
        "embedserve.engine.models.bert:BertEncoder",
        "answerai-colbert-small-v1, colbertv2.0 (PyLate folders)",
        "PyLate folder: query/document markers, query expansion, document skip-list, "
        "projection per token",
        marker="colbert",
        prefixes=BERT_PREFIXES,
    ),
)

FAMILY_BY_NAME = {f.name: f for f in FAMILIES + RETRIEVAL_FAMILIES}

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(
    dict.fromkeys(a for f in FAMILIES for a in f.embed_architectures + f.score_architectures)
)


def family_of(cfg: dict[str, Any], path: Path) -> tuple[Family, str]:
    """The family of a config.json and its first architecture, or an error listing the
    supported ones."""
    architectures = cfg.get("architectures") or []
    arch = architectures[0] if architectures else cfg.get("model_type", "<none>")
    model_type = cfg.get("model_type")
    for family in RETRIEVAL_FAMILIES:
        if model_type in family.model_types and KIND_BY_NAME[family.marker].detect(path.parent):
            return family, arch
    for family in FAMILIES:
        if model_type in family.model_types:
            return family, arch
    for family in FAMILIES:
        if arch in family.embed_architectures + family.score_architectures:
            return family, arch
    raise ModelLoadError(
        f"{path}: unsupported architecture {arch!r} (model_type {model_type!r}); supported: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)} "
        f"(model_type {', '.join(t for f in FAMILIES for t in f.model_types)})"
    )


def models_table() -> str:
    """The Markdown table `embedserve models` prints and docs/models.md holds."""
    rows = [
        "| family | model_type | embeds | scores (rerank) | attention | default pooling | "
        "examples | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in FAMILIES:
        attention = " or ".join(f.attention_kinds)
        if f.attention_note:
            attention += f" ({f.attention_note})"
        pooling = (
            f.pooling_default[0][1]
            if len(f.pooling_default) == 1
            else ", ".join(f"{pool} ({kind})" for kind, pool in f.pooling_default)
        )
        rows.append(
            f"| {f.name} | {', '.join(f.model_types)} | {', '.join(f.embed_architectures)} | "
            f"{', '.join(f.score_architectures) or '-'} | {attention} | {pooling} | "
            f"{f.examples} | {f.notes or '-'} |"
        )
    return "\n".join(rows)


def retrieval_table() -> str:
    """The Markdown table of the sparse and multi-vector layouts (docs/models.md)."""
    rows = ["| layout | encoder | outputs | examples | notes |", "|---|---|---|---|---|"]
    for f in RETRIEVAL_FAMILIES:
        rows.append(
            f"| {f.name} | {', '.join(f.embed_architectures)} | "
            f"{', '.join(KIND_BY_NAME[f.marker].outputs)} | "
            f"{f.examples} | {f.notes} |"
        )
    return "\n".join(rows)
