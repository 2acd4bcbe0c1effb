"""Grouping work under a token budget, and cutting grouped results back apart (no torch).

The offline API groups inputs into engine batches, the gateway groups a request's sequences into
server calls, and the server's queue groups requests into batches: all by `budget_groups`. Each
then hands every caller its own rows with `split_rows`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence

import numpy as np


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


def split_rows(rows: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """`rows` [sum(counts), ...] cut into consecutive views of `counts[i]` rows each."""
    bounds = np.cumsum([0, *counts])
    if int(bounds[-1]) != rows.shape[0]:
        raise RuntimeError(f"got {rows.shape[0]} rows for {int(bounds[-1])} expected")
    return [rows[a:b] for a, b in itertools.pairwise(bounds)]
