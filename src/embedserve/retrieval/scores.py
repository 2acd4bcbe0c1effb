"""Scores of late-interaction and sparse outputs (NumPy, no torch).

- MaxSim (ColBERT, PyLate's `colbert_scores`): for each query vector its largest dot product
  with the document's vectors, summed over the query's vectors.
- bge-m3 (FlagEmbedding's `compute_score`): dense = dot of the normalized CLS vectors; sparse =
  the dot product of the lexical weights over shared token ids; colbert = MaxSim divided by the
  number of query vectors; and the weighted means "sparse+dense" and "colbert+sparse+dense" with
  weights (dense, sparse, colbert), default 1, 1, 1 as FlagEmbedding's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.errors import InputError
from embedserve.loading.retrieval_kinds import KIND_BY_NAME, M3_MODES, RETRIEVAL_KINDS, ScoreRule
from embedserve.retrieval.results import EncodedOutputs, SparseVector


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """sum over query vectors of the max dot product with a document vector."""
    if len(document) == 0:
        return 0.0
    sims = query.astype(np.float64) @ document.astype(np.float64).T
    return float(sims.max(axis=1).sum())


def sparse_dot(a: SparseVector, b: SparseVector) -> float:
    common, ia, ib = np.intersect1d(a["indices"], b["indices"], return_indices=True)
    if not len(common):
        return 0.0
    va, vb = np.asarray(a["values"], np.float64), np.asarray(b["values"], np.float64)
    return float(va[ia] @ vb[ib])


M3_DEFAULT_WEIGHTS = (1.0, 1.0, 1.0)  # FlagEmbedding's weights_for_different_modes default


def m3_scores(
    query: tuple[np.ndarray, SparseVector, np.ndarray],
    documents: Sequence[tuple[np.ndarray, SparseVector, np.ndarray]],
    weights: Sequence[float] = M3_DEFAULT_WEIGHTS,
) -> dict[str, np.ndarray]:
    """bge-m3's five scores per document (see the module docstring); each (dense, sparse,
    multivector) triple is one text's outputs."""
    if len(weights) != 3:
        raise ValueError("weights are (dense, sparse, colbert): three numbers")
    wd, ws, wc = (float(w) for w in weights)
    qd, qs, qm = query
    dense = np.array([float(np.dot(qd, d)) for d, _, _ in documents])
    sparse = np.array([sparse_dot(qs, s) for _, s, _ in documents])
    colbert = np.array([maxsim(qm, m) / max(len(qm), 1) for _, _, m in documents])
    return {
        "dense": dense.astype(np.float32),
        "sparse": sparse.astype(np.float32),
        "colbert": colbert.astype(np.float32),
        "sparse+dense": ((dense * wd + sparse * ws) / (wd + ws)).astype(np.float32),
        "colbert+sparse+dense": ((colbert * wc + sparse * ws + dense * wd) / (wd + ws + wc)).astype(
            np.float32
        ),
    }


@dataclass(frozen=True)
class LatePlan:
    """How a sparse or multi-vector model scores a query against documents: the outputs each
    side is encoded with, the `input_type` of each side, and the score of the outputs (its
    kind's row, `retrieval_kinds`)."""

    score: ScoreRule
    outputs: tuple[str, ...]
    query_type: str | None
    document_type: str | None
    weights: tuple[float, float, float] | None  # bge-m3's (dense, sparse, colbert)

    def scores(self, query: EncodedOutputs, documents: EncodedOutputs) -> np.ndarray:
        """[N] float32: `query` holds one input's outputs, `documents` N inputs'."""
        if self.score == "weighted":
            assert query.dense is not None and query.sparse is not None
            assert query.multivector is not None and documents.dense is not None
            assert documents.sparse is not None and documents.multivector is not None
            triples = list(
                zip(documents.dense, documents.sparse, documents.multivector, strict=True)
            )
            q = (query.dense[0], query.sparse[0], query.multivector[0])
            return m3_scores(q, triples, self.weights or M3_DEFAULT_WEIGHTS)[M3_MODES[-1]]
        if self.score == "maxsim":
            assert query.multivector is not None and documents.multivector is not None
            found = [maxsim(query.multivector[0], m) for m in documents.multivector]
        else:
            assert query.sparse is not None and documents.sparse is not None
            found = [sparse_dot(query.sparse[0], s) for s in documents.sparse]
        return np.asarray(found, dtype=np.float32)


def late_plan(kind: str, weights: Any = None) -> LatePlan:
    """The plan of a model of `kind` (its row's score, outputs and input types); `weights`
    checked: three numbers >= 0 with a positive sum, for a kind whose score takes them
    (bge-m3), else an error. ColBERT encodes queries and documents each their own way;
    bge-m3 encodes both alike (FlagEmbedding's `compute_score` takes no query side)."""
    row = KIND_BY_NAME[kind]
    if row.score_weights:
        query_type, document_type = row.score_input_types
        return LatePlan(row.score, row.outputs, query_type, document_type, _weights(weights))
    if weights is not None:
        weighted = next(k for k in RETRIEVAL_KINDS if k.score_weights)
        raise InputError(
            f"weights are {weighted.name}'s ({', '.join(weighted.score_weights)}); this {kind} "
            f"model scores by {row.score_words} alone",
            param="weights",
        )
    return LatePlan(row.score, row.outputs, *row.score_input_types, None)


def _weights(weights: Any) -> tuple[float, float, float] | None:
    if weights is None:
        return None
    if (
        not isinstance(weights, (list, tuple))
        or len(weights) != 3
        or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights)
        or min(weights) < 0
        or sum(weights) <= 0
    ):
        raise InputError(
            "weights must be three numbers >= 0 (dense, sparse, colbert) with a positive sum; "
            f"got {weights!r}",
            param="weights",
        )
    return (float(weights[0]), float(weights[1]), float(weights[2]))
