"""For studies that call our ONNX graph's session (`engine/onnx_encoder.py`) directly, past the
engine: an embedder pinned to it with held-out queries, and what the graph is fed for one
sequence alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from harness import corpus

if TYPE_CHECKING:
    from embedserve import Embedder
    from embedserve.engine.onnx_encoder import OnnxEncoder


def onnx_queries(count: int = 64) -> tuple[Embedder, OnnxEncoder, list[str], list[list[int]]]:
    """The bundled MiniLM pinned to ONNX Runtime, the `OnnxEncoder` it serves with, `count`
    held-out queries and their token ids."""
    from embedserve import Embedder
    from embedserve.engine.onnx_encoder import OnnxEncoder

    embedder, queries = Embedder(cpu_path="onnx"), corpus.queries(count)
    model = embedder.engine.model
    assert isinstance(model, OnnxEncoder)
    return embedder, model, queries, [list(embedder.tokenizer.encode([q])[0]) for q in queries]


def lone_feed(ids: Sequence[int], position_offset: int = 0) -> dict[str, np.ndarray]:
    """One sequence's inputs: a batch of one row, nothing padded."""
    n = len(ids)
    return {
        "input_ids": np.array([ids], dtype=np.int64),
        "positions": np.arange(n, dtype=np.int64)[None] + position_offset,
        "token_type_ids": np.zeros((1, n), dtype=np.int64),
        "lengths": np.array([n], dtype=np.int32),
    }
