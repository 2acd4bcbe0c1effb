"""`PackedBatch.from_packed`: a request of one sequence (the server's short-query fast path)
gets exactly the arrays and the refusals of the general path."""

from __future__ import annotations

import numpy as np
import pytest

from embedserve.engine.batch import PackedBatch


def general(ids: list[int]) -> PackedBatch:
    """The general path for the same request: explicit all-zero token types take it."""
    zeros = np.zeros(len(ids), dtype=np.int64)
    return PackedBatch.from_packed(np.asarray(ids, "<i4"), np.asarray([len(ids)]), zeros)


@pytest.mark.parametrize("ids", [[101], [101, 7592, 102], list(range(300))])
def test_one_sequence_gets_the_general_paths_arrays(ids: list[int]) -> None:
    fast = PackedBatch.from_packed(np.asarray(ids, "<i4"), np.asarray([len(ids)]))
    slow = general(ids)
    for name in ("input_ids", "seqlens", "cu_seqlens", "positions", "seq_ids", "token_type_ids"):
        a, b = getattr(fast, name), getattr(slow, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert fast.seq_ids is not fast.token_type_ids  # two arrays, as the general path's
    # and with an empty second_segment, as a decoded request carries
    empty = PackedBatch.from_packed(
        np.asarray(ids, "<i4"), np.asarray([len(ids)]), second_segment=np.zeros(0, np.int64)
    )
    assert np.array_equal(empty.positions, slow.positions)


@pytest.mark.parametrize(
    ("ids", "lens", "message"),
    [
        ([1, 2], [0], "every sequence needs at least one token"),
        ([1, 2], [-2], "every sequence needs at least one token"),
        ([1, 2, 3], [2], "seqlens sum to 2 but there are 3 token ids"),
        ([1], [3], "seqlens sum to 3 but there are 1 token ids"),
    ],
)
def test_one_sequence_is_refused_as_the_general_path_refuses(
    ids: list[int], lens: list[int], message: str
) -> None:
    for types in (None, np.zeros(len(ids), np.int64)):
        with pytest.raises(ValueError, match=message):
            PackedBatch.from_packed(np.asarray(ids, "<i4"), np.asarray(lens), types)
