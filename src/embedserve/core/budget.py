"""Grouping work under a token budget, and cutting grouped results back apart (no torch).

The offline API groups inputs into engine batches, the gateway groups a request's sequences into
server calls, and the server's queue groups requests into batches: all by `budget_groups` (the
first two over their sequences sorted by length, `by_length_groups`). Each
then hands every caller its own rows with `split_rows` (`in_input_order`,
`split_in_input_order` after a sort); late-chunking spans follow their pieces into the packing
with `shift_spans`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

# A request is small when SMALL_SHARE of it would still fit in a batch's budget less a token:
# the server's queue lets such requests pass a large one (`server.scheduler`), and the gateway
# counts such calls against --calls-in-flight (`gateway.coalescing`), so both use this one test.
SMALL_SHARE = 8


def is_small(tokens: int, budget: int) -> bool:
    return tokens * SMALL_SHARE < budget


def small_limit(budget: int) -> int:
    """The most tokens a small request may hold under `budget`."""
    return (budget - 1) // SMALL_SHARE


def budget_groups(sizes: Iterable[int], budget: int) -> Iterator[range]:
    """Consecutive index ranges whose sizes add up to at most `budget`, in order.

    An item larger than the budget forms a group of its own (it has to run somewhere). `sizes`
    may be lazy: the server's queue stops it where a batch must end for other reasons.
    """
    if budget <= 0:
        raise ValueError(f"a token budget must be positive, got {budget}")
    start = used = count = 0
    for index, size in enumerate(sizes):
        if index > start and used + size > budget:
            yield range(start, index)
            start, used = index, 0
        used += size
        count = index + 1
    if count > start:
        yield range(start, count)


_ONE = np.zeros(1, dtype=np.intp)  # the one group of a lone item
_ONE.flags.writeable = False


def by_length_groups(lengths: Sequence[int], budget: int) -> list[np.ndarray]:
    """`budget_groups` over the items sorted by length (stable): each group the indices of its
    items in `lengths`, shortest first.

    NOTE: so each batch (or server call) holds sequences of similar length, and a CPU executor
    that pads (ONNX Runtime, `onnx_encoder.length_groups`) pads little and makes fewer calls:
    300 passages of 20-180 words on a 2-core Zen 2, ONNX Runtime, 2,048-token batches, 35.8
    texts/s cut in input order against 42.5 sorted; oneDNN prepacked (ragged) 41 either way."""
    if len(lengths) == 1:  # a lone query, the hot path: no sort (10 µs on a slow core)
        return [_ONE]
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[g.start : g.stop] for g in budget_groups([lengths[i] for i in order], budget)]


def in_input_order(rows: np.ndarray, groups: Sequence[np.ndarray]) -> np.ndarray:
    """`rows` of the `by_length_groups` groups back to back, each put where its item was."""
    if len(rows) < 2:
        return rows
    out = np.empty_like(rows)
    out[np.concatenate(groups)] = rows
    return out


def split_rows(rows: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """`rows` [sum(counts), ...] cut into consecutive views of `counts[i]` rows each."""
    bounds = np.cumsum([0, *counts])
    if int(bounds[-1]) != rows.shape[0]:
        raise RuntimeError(f"got {rows.shape[0]} rows for {int(bounds[-1])} expected")
    return [rows[a:b] for a, b in itertools.pairwise(bounds)]


def split_in_input_order(
    rows: np.ndarray, counts: Sequence[int], groups: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """`rows` of the `by_length_groups` groups' items back to back, `counts[i]` rows for item
    i (a document's chunks, an input's tokens): each item's rows, in input order."""
    order = np.concatenate(groups).tolist() if len(groups) else []
    parts = split_rows(rows, [counts[i] for i in order])
    out = [rows[:0]] * len(counts)
    for i, part in zip(order, parts, strict=True):
        out[i] = part
    return out


def shift_spans(spans: Sequence[Any], lengths: Sequence[int]) -> np.ndarray:
    """[K, 2] int64: each piece's [start, end) token spans (relative to the piece) moved to where
    the piece's tokens sit once the pieces are packed back to back in this order.

    The one place spans are shifted, at both packings: the gateway's documents into one server
    call (`chunking.packed_spans`) and the server's requests into one batch (`scheduler`).
    """
    if len(spans) != len(lengths):
        raise ValueError(f"{len(spans)} span lists for {len(lengths)} pieces")
    if len(spans) == 1:  # one piece (one document, one request): nothing moves
        return np.asarray(spans[0], dtype=np.int64).reshape(-1, 2)
    offsets = np.cumsum([0, *lengths[:-1]], dtype=np.int64)
    moved = [
        np.asarray(s, dtype=np.int64).reshape(-1, 2) + o
        for s, o in zip(spans, offsets, strict=True)
    ]
    return np.concatenate(moved)
