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

import numpy as np

from embedserve.retrieval.outputs import SparseVector


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


M3_MODES = ("dense", "sparse", "colbert", "sparse+dense", "colbert+sparse+dense")


def m3_scores(
    query: tuple[np.ndarray, SparseVector, np.ndarray],
    documents: Sequence[tuple[np.ndarray, SparseVector, np.ndarray]],
    weights: Sequence[float] = (1.0, 1.0, 1.0),
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
