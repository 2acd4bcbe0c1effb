"""The wire between a gateway and a server, both directions, encoded and decoded here only.

A request is token id sequences (packed, little-endian int32), optionally late-chunking spans
(token offsets into the packed sequences, shifted there once by `core.budget.shift_spans`) or a
pair's second segments, and the output head: a `Head` the server applies, or none at all (the
`raw` flag: the pooled float32 rows as the model gives them, for a caller that applies its head
later: windows of `truncate="chunk"` are averaged first, a reranker's logits get its activation).
An answer is one encoded array: its little-endian bytes, shape and dtype name.

A sparse or multi-vector model's request names its `outputs` (and the query side, and the
tokens attended to under query expansion); its answer carries each output compactly: the dense
rows as above, sparse vectors as per-sequence counts with int32 token ids and float32 values
(pooled and thresholded on the server, never a vocabulary-wide row), multi-vector rows as
per-sequence counts with float32 vectors back to back (`encode_outputs_response`).

The server decodes what any client sent, so `decode_request` checks what the wire alone can
say (whole int32s, span pairs, the head against the model's width and output rules); the
server checks the rest against its engine (sequence bounds, spans inside one sequence, ids).
No torch, no tokenizers: the gateway and the server both import this.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.contract import EmbedRequest, EmbedResponse
from embedserve.core.budget import split_rows
from embedserve.core.head import Head, check_head
from embedserve.retrieval.results import EncodedOutputs, SparseVector


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
    outputs: tuple[str, ...] = ()  # a sparse / multi-vector model's outputs; () : pooled rows
    query: bool = False  # the query side (ColBERT)
    visible: tuple[int, ...] | None = None  # per sequence, its attended leading tokens


def encode_request(
    seqs: Sequence[Sequence[int]],
    head: Head | None,
    *,
    spans: np.ndarray | None = None,
    second_segment: Sequence[int] | None = None,
    outputs: Sequence[str] = (),
    query: bool = False,
    visible: Sequence[int] | None = None,
) -> Any:
    """The EmbedRequest for `seqs`; `head` None asks for raw rows; `spans` [K, 2] are token
    offsets into the sequences packed back to back (`chunking.packed_spans`); `outputs` (a
    sparse or multi-vector model's, with `query` and `visible`) see the contract."""
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
        outputs=list(outputs),
        query=query,
        visible_tokens=[] if visible is None else list(visible),
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
    outputs = tuple(request.outputs)
    visible = tuple(request.visible_tokens) or None
    if outputs and (spans is not None or len(request.second_segment) or request.raw):
        raise ValueError("a request for outputs takes no span_bounds, second_segment or raw")
    if not outputs and (request.query or visible is not None):
        raise ValueError("query and visible_tokens come with outputs")
    if visible is not None and len(visible) != len(request.seqlens):
        raise ValueError(
            f"visible_tokens has {len(visible)} entries for {len(request.seqlens)} sequences"
        )
    if visible is not None and any(
        not 0 < v <= n for v, n in zip(visible, request.seqlens, strict=True)
    ):
        raise ValueError("each visible_tokens entry must be in [1, its sequence's length]")
    # NOTE: np.fromiter, not np.asarray: numpy reads a protobuf repeated field element by
    # element through the sequence protocol, finding the dtype as it goes (2.5x the time)
    seqlens, second = request.seqlens, request.second_segment
    return WireRequest(
        np.frombuffer(raw, dtype="<i4"),
        np.fromiter(seqlens, dtype=np.int64, count=len(seqlens)),
        np.fromiter(second, dtype=np.int64, count=len(second)),
        spans,
        _decode_head(request, output_width, output_rules),
        outputs,
        bool(request.query),
        visible,
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
    return _checked_head(
        output_width,
        output_rules,
        request.dimensions or None,
        bool(request.normalize),
        request.output_dtype or "float32",
    )


# the heads a server checks, remembered: a request's head is one of a few (its checks cost
# more than the rest of the request's decoding); a refused one raises each time
_checked_head = functools.lru_cache(maxsize=64)(check_head)


def encode_response(pooled: np.ndarray, head: Head | None) -> Any:
    """The EmbedResponse of pooled rows [rows, width] under a request's head (None: raw)."""
    return _response(np.asarray(pooled, dtype=np.float32) if head is None else head.apply(pooled))


def _response(out: np.ndarray) -> Any:
    """The EmbedResponse of encoded rows, little-endian."""
    out = np.ascontiguousarray(out, dtype=out.dtype.newbyteorder("<"))
    return EmbedResponse(embeddings=out.tobytes(), shape=list(out.shape), dtype=out.dtype.name)


def encode_responses(
    pooled: np.ndarray, heads: Sequence[Head | None], counts: Sequence[int]
) -> list[Any]:
    """Each request's EmbedResponse of its `counts[i]` consecutive rows of `pooled`, under its
    head. A head every request shares is applied once to all the rows: a head works row by row
    (truncate, normalize, encode), so each answer holds the bytes `encode_response` gives it
    alone, for one call instead of one per request (a merged batch of short queries)."""
    first = heads[0]
    if first is None or len(heads) == 1 or any(h != first for h in heads):
        return [
            encode_response(p, h) for p, h in zip(split_rows(pooled, counts), heads, strict=True)
        ]
    return [_response(part) for part in split_rows(first.apply(pooled), counts)]


def decode_response(response: Any, num_rows: int) -> np.ndarray:
    """The answer's array [num_rows, width] (a read-only view of its bytes); WireError when its
    shape is not `num_rows` rows."""
    shape = tuple(response.shape)
    if len(shape) != 2 or shape[0] != num_rows:
        raise WireError(f"replica answered shape {shape} for {num_rows} rows")
    out = np.frombuffer(response.embeddings, dtype=np.dtype(response.dtype).newbyteorder("<"))
    return out.reshape(shape)


def encode_outputs_response(
    head: Head,
    dense: np.ndarray | None,
    sparse: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    vectors: tuple[np.ndarray, np.ndarray] | None,
) -> Any:
    """The EmbedResponse of one request's outputs: `dense` pooled rows [S, H] (the head applied
    here), `sparse` (counts [S], token ids, values), `vectors` (counts [S], [N, D] float32)."""
    fields: dict[str, Any] = {}
    if dense is not None:
        out = head.apply(dense)
        out = np.ascontiguousarray(out, dtype=out.dtype.newbyteorder("<"))
        fields.update(embeddings=out.tobytes(), shape=list(out.shape), dtype=out.dtype.name)
    if sparse is not None:
        counts, indices, values = sparse
        fields.update(
            sparse_counts=np.asarray(counts).tolist(),
            sparse_indices=np.asarray(indices, dtype="<i4").tobytes(),
            sparse_values=np.asarray(values, dtype="<f4").tobytes(),
        )
    if vectors is not None:
        counts, rows = vectors
        fields.update(
            vector_counts=np.asarray(counts).tolist(),
            vectors=np.ascontiguousarray(rows, dtype="<f4").tobytes(),
            vector_dims=int(rows.shape[1]),
        )
    return EmbedResponse(**fields)


def decode_outputs_response(response: Any, num_rows: int, outputs: Sequence[str]) -> EncodedOutputs:
    """The outputs of an answer for `num_rows` sequences (each asked output present, whole);
    WireError when the answer does not fit its request."""
    dense = decode_response(response, num_rows) if "dense" in outputs else None
    sparse: list[SparseVector] | None = None
    if "sparse" in outputs:
        counts = np.asarray(response.sparse_counts, dtype=np.int64)
        indices = np.frombuffer(response.sparse_indices, dtype="<i4")
        values = np.frombuffer(response.sparse_values, dtype="<f4")
        if len(counts) != num_rows or not counts.sum() == len(indices) == len(values):
            raise WireError(
                f"replica answered {len(counts)} sparse vectors of {len(indices)} ids and "
                f"{len(values)} values for {num_rows} rows"
            )
        bounds = np.concatenate([[0], np.cumsum(counts)])
        sparse = [
            {"indices": indices[a:b].tolist(), "values": values[a:b].tolist()}
            for a, b in itertools.pairwise(bounds)
        ]
    multivector: list[np.ndarray] | None = None
    if "multivector" in outputs:
        counts = np.asarray(response.vector_counts, dtype=np.int64)
        dims = int(response.vector_dims)
        flat = np.frombuffer(response.vectors, dtype="<f4")
        if len(counts) != num_rows or dims <= 0 or flat.size != counts.sum() * dims:
            raise WireError(
                f"replica answered {len(counts)} vector counts, {flat.size} floats of width "
                f"{dims} for {num_rows} rows"
            )
        rows = flat.reshape(-1, dims)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        multivector = [rows[a:b] for a, b in itertools.pairwise(bounds)]
    return EncodedOutputs(dense, sparse, multivector)
