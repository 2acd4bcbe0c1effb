"""What our ONNX graph (`engine/onnx_encoder.py`) is fed for one sequence alone, for studies that
call its session directly, past the engine."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def lone_feed(ids: Sequence[int], position_offset: int = 0) -> dict[str, np.ndarray]:
    """One sequence's inputs: a batch of one row, nothing padded."""
    n = len(ids)
    return {
        "input_ids": np.array([ids], dtype=np.int64),
        "positions": np.arange(n, dtype=np.int64)[None] + position_offset,
        "token_type_ids": np.zeros((1, n), dtype=np.int64),
        "lengths": np.array([n], dtype=np.int32),
    }
