"""The offline encode of a sparse or multi-vector model: sequences in token-budget batches
through `Engine.encode_outputs` (one forward per batch for every output asked for), then each
input's outputs in input order (`outputs.EncodedOutputs`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from embedserve.core.budget import budget_groups
from embedserve.core.head import Head
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.errors import TRUNCATE_ADVICE, InputError, InputTooLong
from embedserve.retrieval.results import EncodedOutputs, SparseVector


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
        tokens=[len(s) for s in seqs],
    )


# texts per `encode_outputs` call when a whole file is encoded (`encode_in_pieces`): 64 bge-m3
# texts of 512 tokens are the multi-vector limit of one call (`outputs.MAX_MULTIVECTOR_VALUES`)
PIECE_TEXTS = 64


def encode_in_pieces(
    encode: Callable[[Sequence[str]], EncodedOutputs],
    texts: Sequence[str],
    piece: int | None = None,
) -> Iterator[tuple[int, EncodedOutputs]]:
    """(start, outputs) of `encode` over consecutive pieces of `texts`, in order. A piece whose
    multi-vector answer would be over the per-call limit is halved until it fits (one text over
    it alone is the error); an over-long text's error names its index in all of `texts`.
    `piece`: texts per call, at most (default PIECE_TEXTS)."""
    piece = piece or PIECE_TEXTS
    start = 0
    while start < len(texts):
        n = min(piece, len(texts) - start)
        while True:
            try:
                out = encode(texts[start : start + n])
                break
            except InputTooLong as e:
                raise InputTooLong(
                    _shifted(e.where, start), e.num_tokens, e.max_length, TRUNCATE_ADVICE
                ) from None
            except InputError as e:
                if e.code != "output_too_large" or n == 1:
                    raise
                n = (n + 1) // 2
        yield start, out
        start += n


def _shifted(where: str, start: int) -> str:
    """ "input[i]" of a piece as "input[start + i]" of the whole list."""
    return re.sub(r"^input\[(\d+)\]", lambda m: f"input[{int(m[1]) + start}]", where)
