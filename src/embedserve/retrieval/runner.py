"""The offline encode of a sparse or multi-vector model: sequences in token-budget batches
through `Engine.encode_outputs` (one forward per batch for every output asked for), then each
input's outputs in input order (`outputs.EncodedOutputs`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embedserve.core.budget import budget_groups
from embedserve.core.outputs import Head
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.retrieval.outputs import EncodedOutputs, SparseVector


def run_outputs(
    engine: Engine,
    seqs: Sequence[Sequence[int]],
    outputs: tuple[str, ...],
    head: Head,
    batch_tokens: int,
    *,
    query: bool = False,
    visible: Sequence[int] | None = None,
) -> EncodedOutputs:
    """`outputs` of every sequence; `visible`: per sequence, its attended leading tokens."""
    dense: list[np.ndarray] = []
    sparse: list[SparseVector] = []
    vectors: list[np.ndarray] = []
    for group in budget_groups([len(s) for s in seqs], batch_tokens):
        batch = PackedBatch.from_token_lists([seqs[i] for i in group])
        keys = None if visible is None else tuple(visible[i] for i in group)
        out = engine.encode_outputs(batch, outputs, query=query, visible_keys=keys)
        if out.dense is not None:
            dense.append(out.dense)
        for i in range(len(group)):
            if out.sparse is not None:
                idx, val = out.sparse.row(i)
                sparse.append({"indices": idx.tolist(), "values": val.tolist()})
            if out.multivector is not None:
                vectors.append(out.multivector.row(i))
    return EncodedOutputs(
        dense=head.apply(np.concatenate(dense)) if "dense" in outputs else None,
        sparse=sparse if "sparse" in outputs else None,
        multivector=vectors if "multivector" in outputs else None,
    )
