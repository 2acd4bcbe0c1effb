"""A whole file's texts through an offline encode of sparse or multi-vector outputs, in pieces
that stay under the multi-vector limit of one call (`encode_in_pieces`; the encode itself is
`Embedder.encode_outputs`). No torch: the pieces are cut by their texts alone."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

from embedserve.errors import TRUNCATE_ADVICE, InputError, InputTooLong
from embedserve.retrieval.results import EncodedOutputs

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
