"""Late chunking's span pooling: `Engine.embed_spans` over packed documents, `check_spans`."""

from __future__ import annotations

import numpy as np
import pytest

from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine


@pytest.fixture(scope="module")
def engine(minilm_path) -> Engine:  # type: ignore[no-untyped-def]
    return Engine.from_folder(minilm_path, device="cpu", dtype="float32")


def _docs(engine: Engine) -> PackedBatch:
    rng = np.random.default_rng(0)
    return PackedBatch.from_token_lists(
        [rng.integers(1000, engine.vocab_size, n).tolist() for n in (12, 30, 7)]
    )


def test_whole_sequence_spans_equal_mean_pooled_step(engine: Engine) -> None:
    assert engine.spec.pooling == "mean"
    batch = _docs(engine)
    spans = np.stack([batch.cu_seqlens[:-1], batch.cu_seqlens[1:]], axis=1)
    got = engine.embed_spans(batch, spans)
    assert got.shape == (3, engine.hidden_size) and got.dtype == np.float32
    np.testing.assert_allclose(got, engine.step(batch).wait(), atol=1e-5, rtol=1e-4)


def test_spans_of_a_document_do_not_depend_on_its_batch(engine: Engine) -> None:
    batch = _docs(engine)
    start = int(batch.cu_seqlens[1])  # the second document, 30 tokens
    inside = np.array([[start, start + 10], [start + 8, start + 30]])  # overlapping chunks
    alone = PackedBatch.from_token_lists([batch.input_ids[start : start + 30].tolist()])
    got = engine.embed_spans(batch, inside)
    want = engine.embed_spans(alone, inside - start)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("spans", "message"),
    [
        (np.zeros((0, 2)), "non-empty"),
        (np.array([[3, 3]]), "non-empty and within"),
        (np.array([[40, 50]]), "non-empty and within"),
        (np.array([[10, 14]]), "sequence boundary"),
    ],
)
def test_bad_spans_are_refused(engine: Engine, spans: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine.embed_spans(_docs(engine), spans)
