"""Identical sequences of one request embedded once (issue 56): the distinct ones in first-seen
order and each input's row among them; through `Embedder.encode` and the gateway's pipeline the
answers equal those without collapsing, and the engine sees each distinct sequence once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from embedserve.core.duplicates import unique_sequences
from embedserve.embedder import Embedder


def test_unique_sequences_keep_the_first_seen_order() -> None:
    seqs = [[1, 2], [3], [1, 2], [1], [3], [1, 2, 0]]
    unique, back = unique_sequences(seqs)
    assert unique == [[1, 2], [3], [1], [1, 2, 0]]
    assert back is not None and back.tolist() == [0, 1, 0, 2, 1, 3]
    assert unique_sequences([[1], [2]]) == ([[1], [2]], None)
    assert unique_sequences([]) == ([], None)


def test_an_encode_embeds_each_distinct_text_once(minilm_path: Path) -> None:
    embedder = Embedder(minilm_path, device="cpu", dtype="float32")
    texts = ["alpha beta", "gamma", "alpha beta", "delta epsilon", "gamma", "alpha beta"]
    seen: list[int] = []
    step = embedder.engine.step

    def counting(batch: Any) -> Any:
        seen.append(batch.num_seqs)
        return step(batch)

    embedder.engine.step = counting  # type: ignore[method-assign]
    got = embedder.encode(texts)
    assert sum(seen) == 3  # three distinct texts
    alone = np.stack([embedder.encode(t) for t in texts])
    np.testing.assert_allclose(got, alone, atol=2e-6)
    np.testing.assert_array_equal(got[0], got[2])
    # a prompt makes two equal texts distinct sequences only if it differs: the same one here
    assert embedder.encode(["x", "x"], prompt="query: ").shape == (2, 384)
