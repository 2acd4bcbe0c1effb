"""The gateway's outputs of one request, sent as parts cut from its inputs sorted by length
(`core.budget.by_length_groups`), joined back in input order (`retrieval.results.join_outputs`)."""

from __future__ import annotations

import numpy as np

from embedserve.core.budget import by_length_groups
from embedserve.retrieval.results import EncodedOutputs, join_outputs


def _part(indices: np.ndarray) -> EncodedOutputs:
    """A server's answer for the inputs `indices`: each output names its input."""
    return EncodedOutputs(
        dense=np.asarray([[float(i), 0.0] for i in indices], dtype=np.float32),
        sparse=[{"indices": [int(i)], "values": [1.0]} for i in indices],
        multivector=[np.full((int(i) + 1, 2), float(i), dtype=np.float32) for i in indices],
    )


def test_parts_cut_by_length_come_back_in_input_order() -> None:
    lengths = [9, 2, 30, 2, 7, 15, 1]
    groups = by_length_groups(lengths, budget=10)
    assert len(groups) > 2 and [int(i) for i in np.concatenate(groups)] != list(range(7))
    joined = join_outputs([_part(g) for g in groups], groups)
    assert joined.dense is not None and joined.dense[:, 0].tolist() == list(range(7))
    assert joined.sparse is not None
    assert [v["indices"] for v in joined.sparse] == [[i] for i in range(7)]
    assert joined.multivector is not None
    assert [(len(v), v[0, 0]) for v in joined.multivector] == [(i + 1, i) for i in range(7)]


def test_parts_in_input_order_join_as_they_are() -> None:
    parts = [_part(np.arange(0, 3)), _part(np.arange(3, 5))]
    joined = join_outputs(parts)
    assert joined.dense is not None and joined.dense[:, 0].tolist() == [0, 1, 2, 3, 4]
    one = join_outputs([_part(np.arange(1))], by_length_groups([4], 10))
    assert one.sparse == [{"indices": [0], "values": [1.0]}]
