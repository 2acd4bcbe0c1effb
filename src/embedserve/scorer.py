"""The offline scoring API: `Scorer(model).score(query, documents)` and `.rerank(...)`; and a
sequence classifier's, `Classifier(model).classify(texts)` (`core.classify`).

A reranker folder (a cross-encoder or an LLM reranker, `spec.ScoreSpec`) scores each
(query, document) pair in one forward; an embedding model scores by the cosine of the query's
vector with each document's (a bi-encoder: the query embedded with the folder's query prompt,
documents with its document prompt). Pairs go through the request core (`pairs`), token-budget
batches and the engine's graphs like embeddings do.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import embedserve.cpu_threads  # noqa: F401  (how torch's CPU threads wait: before torch loads)
from embedserve.core.classify import ClassifyPreparer, Prediction
from embedserve.core.pairs import (
    Fields,
    PairPreparer,
    check_top_n,
    named,
    plan_cosine,
    ranked,
    read_documents,
    read_text,
    scoring_kind,
    text_names,
)
from embedserve.core.tokenization import TextTokenizer
from embedserve.embedder import Embedder, run_batches
from embedserve.engine.engine import Engine
from embedserve.errors import InputError
from embedserve.loading.bundled import DEFAULT_MODEL, resolve_model
from embedserve.loading.retrieval_kinds import KIND_BY_NAME
from embedserve.loading.spec import ModelLoadError, read_model_spec
from embedserve.retrieval.scores import M3_DEFAULT_WEIGHTS, late_plan, m3_scores

__all__ = ["Classifier", "Prediction", "Ranked", "Scorer"]


@dataclass(frozen=True)
class Ranked:
    """One document of a rerank: its place in the input, its score, and its text."""

    index: int
    relevance_score: float
    document: str


class Scorer:
    """Relevance scores of documents for a query.

    >>> Scorer("minilm").rerank("a query", ["a document", "another"], top_n=1)[0].index
    0
    """

    def __init__(
        self,
        model: str | Path = DEFAULT_MODEL,
        *,
        device: str | None = "auto",
        dtype: str | None = None,
        attention_backend: str | None = None,
    ) -> None:
        folder = resolve_model(model)
        spec = read_model_spec(folder)
        if spec.task == "classify":
            raise ModelLoadError(
                f"{folder}: a sequence classifier ({spec.output_width} labels), not a "
                "reranker; classify with embedserve.scorer.Classifier"
            )
        self.spec = spec
        self.embedder: Embedder | None = None
        self.pairs: PairPreparer | None = None
        if spec.task == "embed":  # a bi-encoder: cosine of embeddings
            self.embedder = Embedder(
                folder, device=device, dtype=dtype, attention_backend=attention_backend
            )
            self.engine = self.embedder.engine
        else:
            tokenizer = TextTokenizer(folder / "tokenizer.json", spec.max_seq_length)
            self.pairs = PairPreparer(spec, tokenizer)
            self.engine = Engine(
                spec, device=device, dtype=dtype, attention_backend=attention_backend
            )

    @property
    def kind(self) -> str:
        """cross-encoder, llm-reranker or bi-encoder (`pairs.scoring_kind`)."""
        return scoring_kind(self.spec)

    def score(
        self,
        query: str,
        documents: Sequence[str],
        *,
        truncate: Any = False,
        instruction: str | None = None,
        raw: bool = False,
        batch_tokens: int | None = None,
        weights: Sequence[float] | None = None,
    ) -> np.ndarray:
        """One score per document [N] float32, in document order.

        Sparse and multi-vector models: ColBERT by MaxSim (PyLate's), SPLADE by the sparse dot
        product, bge-m3 by FlagEmbedding's weighted "colbert+sparse+dense" (`weights`: dense,
        sparse, colbert; default 1, 1, 1); `score_modes` gives each of bge-m3's scores.

        Rerankers: the model's activation of its logit (sentence-transformers CrossEncoder's
        convention; an LLM reranker's probability of "yes"), or the logit itself with `raw`.
        Embedding models: the cosine similarity. `truncate` ("end" | "start") cuts a document
        whose pair is over the model's limit, never the query; `instruction`: the LLM
        reranker's (or a Qwen3 embedder's query) instruction.
        """
        budget = batch_tokens or self.engine.batch_tokens
        if self.spec.retrieval is not None:
            if raw or instruction is not None:
                raise InputError("raw and instruction are for rerankers", param="raw")
            return self._late_scores(query, documents, truncate, budget, weights)
        if self.pairs is None:
            assert self.embedder is not None
            if raw:
                raise InputError(
                    "raw scores are a reranker's logits; an embedding model has none", param="raw"
                )
            plan = plan_cosine(
                self.embedder.inputs,
                query,
                documents,
                truncate=truncate,
                instruction=instruction,
            )
            embed = functools.partial(self.embedder.encode_checked, batch_tokens=budget)
            query_names, document_names = text_names([Fields()], [len(plan.documents)])
            with named(query_names):  # errors name the query and documents, not `input`
                q = embed([plan.query], plan.query_options, plan.head)
            with named(document_names):
                return plan.scores(q, embed(plan.documents, plan.document_options, plan.head))
        prepared = self.pairs.prepare(query, documents, truncate=truncate, instruction=instruction)
        logits = run_batches(
            self.engine, prepared.seqs, budget, second_segment=prepared.second_segment
        )[:, 0]
        return logits.astype(np.float32) if raw else self.pairs.activate(logits)

    def score_modes(
        self,
        query: str,
        documents: Sequence[str],
        *,
        weights: Sequence[float] = M3_DEFAULT_WEIGHTS,
        truncate: Any = False,
        batch_tokens: int | None = None,
    ) -> dict[str, np.ndarray]:
        """bge-m3's five scores per document, as FlagEmbedding's `compute_score` names them
        (`retrieval_kinds.M3_MODES`); `weights`: (dense, sparse, colbert)."""
        r = self.spec.retrieval
        if r is None or not KIND_BY_NAME[r.kind].score_modes:
            raise InputError("score_modes is for bge-m3 (dense + sparse + multi-vector)")
        assert self.embedder is not None
        budget = batch_tokens or self.engine.batch_tokens
        encode = functools.partial(self.embedder.encode_outputs, batch_tokens=budget)
        q = encode([query], truncate=truncate)
        d = encode(list(read_documents(documents)), truncate=truncate)
        assert q.dense is not None and q.sparse is not None and q.multivector is not None
        assert d.dense is not None and d.sparse is not None and d.multivector is not None
        triples = list(zip(d.dense, d.sparse, d.multivector, strict=True))
        return m3_scores((q.dense[0], q.sparse[0], q.multivector[0]), triples, weights)

    def _late_scores(
        self,
        query: str,
        documents: Sequence[str],
        truncate: Any,
        budget: int,
        weights: Sequence[float] | None,
    ) -> np.ndarray:
        assert self.embedder is not None and self.spec.retrieval is not None
        plan = late_plan(self.spec.retrieval.kind, weights)
        encode = functools.partial(
            self.embedder.encode_outputs, outputs=plan.outputs, batch_tokens=budget,
            truncate=truncate,
        )  # fmt: skip
        docs = read_documents(documents)
        query_names, document_names = text_names([Fields()], [len(docs)])
        with named(query_names):  # errors name the query and documents, not `input`
            q = encode([read_text(query, "query")], input_type=plan.query_type)
        with named(document_names):
            return plan.scores(q, encode(docs, input_type=plan.document_type))

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        **options: Any,
    ) -> list[Ranked]:
        """The documents by descending score (ties in input order), the first `top_n`."""
        top_n = check_top_n(top_n)
        docs = read_documents(documents)
        scores = self.score(query, docs, **options)
        order = ranked(scores, top_n)
        return [Ranked(i, float(scores[i]), docs[i]) for i in order]


class Classifier:
    """A sequence classifier's labels for texts and pairs of texts (task "classify").

    >>> Classifier(folder).classify("I loved it")[0][0].label  # doctest: +SKIP
    'positive'
    """

    def __init__(
        self,
        model: str | Path,
        *,
        device: str | None = "auto",
        dtype: str | None = None,
        attention_backend: str | None = None,
    ) -> None:
        folder = resolve_model(model)
        spec = read_model_spec(folder)
        if spec.labels is None:
            raise ModelLoadError(
                f"{folder}: not a sequence classifier ({spec.architecture}, task {spec.task!r}); "
                "a *ForSequenceClassification folder with two labels or more classifies"
            )
        self.spec = spec
        tokenizer = TextTokenizer(folder / "tokenizer.json", spec.max_seq_length)
        self.preparer = ClassifyPreparer(spec, tokenizer)
        self.engine = Engine(spec, device=device, dtype=dtype, attention_backend=attention_backend)

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels, in the order of `predict`'s columns."""
        return self.preparer.labels.labels

    def predict(
        self,
        inputs: Any,
        *,
        truncate: Any = False,
        raw: bool = False,
        batch_tokens: int | None = None,
    ) -> np.ndarray:
        """[N, num_labels] float32 in input order (one text: [1, num_labels]): each label's
        probability (softmax over the labels, or a sigmoid per label for a multi-label
        classifier, `labels.LabelSpec`), or the logits with `raw`. `inputs`: a text, or a list of
        texts and (text, text) pairs; `truncate` (True / "end" | "start") cuts an over-long one."""
        prepared = self.preparer.prepare(inputs, truncate=truncate)
        logits = run_batches(
            self.engine,
            prepared.seqs,
            batch_tokens or self.engine.batch_tokens,
            second_segment=prepared.second_segment,
        )
        return self.preparer.scores(logits, raw=raw)

    def classify(
        self, inputs: Any, *, top_k: int | None = None, **options: Any
    ) -> list[list[Prediction]]:
        """Per input, its labels by descending score, the first `top_k` (`predict`'s options)."""
        top_k = check_top_n(top_k)
        return self.preparer.predictions(self.predict(inputs, **options), top_k)
