"""The wire between a gateway and a server, both directions, encoded and decoded here only.

A request is token id sequences (packed, little-endian int32), optionally late-chunking spans
(token offsets into the packed sequences, shifted there once by `core.budget.shift_spans`) or a
pair's second segments, and the output head: a `Head` the server applies, or none at all (the
`raw` flag: the pooled float32 rows as the model gives them, for a caller that applies its head
later: windows of `truncate="chunk"` are averaged first, a reranker's logits get its activation).
An answer is one encoded array: its little-endian bytes, shape and dtype name.

The server decodes what any client sent, so `decode_request` checks what the wire alone can
say (whole int32s, span pairs, the head against the model's width and output rules); the
server checks the rest against its engine (sequence bounds, spans inside one sequence, ids).
No torch, no tokenizers: the gateway and the server both import this.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.contract import EmbedRequest, EmbedResponse
from embedserve.core.outputs import Head, check_head


class WireError(ValueError):
    """An answer that does not fit its request (a server bug or a mismatched version)."""


@dataclass(frozen=True)
class WireRequest:
    """A decoded EmbedRequest, its head checked."""

    input_ids: np.ndarray  # [T] little-endian int32, every sequence back to back
    seqlens: np.ndarray  # [S] tokens per sequence
    second_segment: np.ndarray  # [S] int64 offsets of token type 1, or empty: all type 0
    spans: np.ndarray | None  # [K, 2] int64 [start, end) into input_ids; None: one row per seq
    head: Head | None  # None: raw pooled float32 rows


def encode_request(
    seqs: Sequence[Sequence[int]],
    head: Head | None,
    *,
    spans: np.ndarray | None = None,
    second_segment: Sequence[int] | None = None,
) -> Any:
    """The EmbedRequest for `seqs`; `head` None asks for raw rows; `spans` [K, 2] are token
    offsets into the sequences packed back to back (`chunking.packed_spans`)."""
    lengths = [len(s) for s in seqs]
    if len(seqs) == 1:  # one query: no generator over its tokens
        ids = np.asarray(seqs[0], dtype="<i4")
    else:
        ids = np.fromiter(itertools.chain.from_iterable(seqs), dtype="<i4", count=sum(lengths))
    fields: dict[str, Any] = {"raw": True}
    if head is not None:
        fields = {
            "dimensions": head.dimensions,
            "normalize": head.normalize,
            "output_dtype": head.output_dtype,
        }
    return EmbedRequest(
        input_ids=ids.tobytes(),
        seqlens=lengths,
        span_bounds=[] if spans is None else np.asarray(spans).reshape(-1).tolist(),
        second_segment=second_segment or [],
        **fields,
    )


def decode_request(request: Any, output_width: int, output_rules: str = "generic") -> WireRequest:
    """An EmbedRequest's arrays and checked head, for a model whose rows are `output_width`
    wide under `output_rules`. Raises ValueError (an InputError for the head) with a message
    for the client."""
    raw = request.input_ids
    if len(raw) % 4:
        raise ValueError(f"input_ids has {len(raw)} bytes, not a whole number of int32s")
    spans = None
    if len(request.span_bounds):
        bounds = np.asarray(request.span_bounds, dtype=np.int64)
        if bounds.size % 2:
            raise ValueError(f"span_bounds has {bounds.size} entries, not [start, end) pairs")
        spans = bounds.reshape(-1, 2)
    return WireRequest(
        np.frombuffer(raw, dtype="<i4"),
        np.asarray(request.seqlens),
        np.asarray(request.second_segment, dtype=np.int64),
        spans,
        _decode_head(request, output_width, output_rules),
    )


def _decode_head(request: Any, output_width: int, output_rules: str) -> Head | None:
    if request.raw:
        if request.dimensions or request.normalize or request.output_dtype not in ("", "float32"):
            raise ValueError(
                "a raw request asks for the pooled float32 rows: it takes no dimensions, "
                "normalize or output_dtype"
            )
        return None
    # NOTE: unset fields read as proto3 defaults: every dimension, no normalizing, float32
    return check_head(
        output_width,
        output_rules,
        request.dimensions or None,
        bool(request.normalize),
        request.output_dtype or "float32",
    )


def encode_response(pooled: np.ndarray, head: Head | None) -> Any:
    """The EmbedResponse of pooled rows [rows, width] under a request's head (None: raw)."""
    out = np.asarray(pooled, dtype=np.float32) if head is None else head.apply(pooled)
    out = np.ascontiguousarray(out, dtype=out.dtype.newbyteorder("<"))
    return EmbedResponse(embeddings=out.tobytes(), shape=list(out.shape), dtype=out.dtype.name)


def decode_response(response: Any, num_rows: int) -> np.ndarray:
    """The answer's array [num_rows, width] (a read-only view of its bytes); WireError when its
    shape is not `num_rows` rows."""
    shape = tuple(response.shape)
    if len(shape) != 2 or shape[0] != num_rows:
        raise WireError(f"replica answered shape {shape} for {num_rows} rows")
    out = np.frombuffer(response.embeddings, dtype=np.dtype(response.dtype).newbyteorder("<"))
    return out.reshape(shape)
