"""Token-budget grouping and result splitting, shared by the offline API, gateway and server."""

from __future__ import annotations

import numpy as np
import pytest

from embedserve.core.budget import (
    budget_groups,
    by_length_groups,
    in_input_order,
    shift_spans,
    split_in_input_order,
    split_rows,
)


def groups(sizes: list[int], budget: int) -> list[list[int]]:
    return [list(r) for r in budget_groups(sizes, budget)]


def test_groups_are_consecutive_and_under_the_budget() -> None:
    assert groups([3, 3, 3, 3], 6) == [[0, 1], [2, 3]]
    assert groups([10, 1, 1], 6) == [[0], [1, 2]]  # a long one goes alone
    assert groups([1, 1, 10], 6) == [[0, 1], [2]]
    assert groups([3, 3, 3, 10, 1], 6) == [[0, 1], [2], [3], [4]]
    assert groups([5], 6) == [[0]]
    assert groups([], 6) == []


def test_groups_take_a_lazy_iterable() -> None:
    taken = []

    def sizes():  # the server stops the iteration where a batch must end anyway
        for n in (2, 2, 2):
            taken.append(n)
            yield n

    first = next(budget_groups(sizes(), 4))
    assert list(first) == [0, 1] and len(taken) == 3


def test_bad_budget() -> None:
    with pytest.raises(ValueError, match="positive"):
        list(budget_groups([1], 0))


def test_split_rows() -> None:
    rows = np.arange(12).reshape(6, 2)
    parts = split_rows(rows, [1, 0, 2, 3])
    assert [p.shape[0] for p in parts] == [1, 0, 2, 3]
    np.testing.assert_array_equal(np.concatenate(parts), rows)
    with pytest.raises(RuntimeError, match="got 6 rows for 5 expected"):
        split_rows(rows, [5])


def test_spans_shift_by_the_pieces_before_them() -> None:
    alone = np.array([[0, 2], [1, 3]], dtype=np.int64)
    assert shift_spans([alone], [4]).tolist() == alone.tolist()  # one piece: nothing moves
    shifted = shift_spans([alone, [(0, 1)], [(2, 3)]], [4, 2, 5])
    assert shifted.tolist() == [[0, 2], [1, 3], [4, 5], [8, 9]]
    with pytest.raises(ValueError, match="2 span lists for 1 pieces"):
        shift_spans([alone, alone], [4])


def test_groups_by_length_cover_every_item_once_shortest_first() -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 200, size=60).tolist()
    groups = by_length_groups(lengths, 512)
    flat = np.concatenate(groups)
    assert sorted(flat.tolist()) == list(range(60))
    assert [lengths[i] for i in flat] == sorted(lengths)  # shortest first, across the groups
    assert all(sum(lengths[i] for i in g) <= 512 for g in groups)
    assert by_length_groups([5, 3, 5, 3], 100)[0].tolist() == [1, 3, 0, 2]  # ties keep order


def test_rows_of_groups_by_length_come_back_in_input_order() -> None:
    lengths = [30, 4, 17, 4, 60, 1]
    groups = by_length_groups(lengths, 40)
    rows = np.concatenate([np.array([[lengths[i], i] for i in g]) for g in groups])
    assert in_input_order(rows, groups).tolist() == [[n, i] for i, n in enumerate(lengths)]
    assert in_input_order(np.empty((0, 2)), []).shape == (0, 2)
    assert [g.tolist() for g in by_length_groups([7], 4)] == [[0]]  # alone, over the budget
    assert by_length_groups([], 4) == []


def test_each_items_rows_of_groups_by_length_come_back_in_input_order() -> None:
    """A document's chunk rows (`counts[i]` of them), its batch cut from the documents sorted by
    length: each document gets its own rows, in input order."""
    lengths, counts = [30, 4, 17, 4, 60], [3, 1, 2, 1, 4]
    groups = by_length_groups(lengths, 40)
    rows = np.concatenate(
        [np.array([[i, k] for k in range(counts[i])]) for i in np.concatenate(groups)]
    )
    out = split_in_input_order(rows, counts, groups)
    assert [r.tolist() for r in out] == [[[i, k] for k in range(n)] for i, n in enumerate(counts)]
    assert split_in_input_order(np.empty((0, 2)), [], []) == []
