"""The engine as the Embed service sees it: a step that returns a result handle, and the handle,
ready at once (the CPU, span pooling, outputs) or when the device is done (a `LazyTensor`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from embedserve.engine.batch import PackedBatch


class ResultHandle(Protocol):
    def ready(self) -> bool: ...
    def wait(self) -> np.ndarray: ...


# Late chunking: run a batch through the model and mean-pool each [start, end) span of its packed
# tokens: [K, H] float32 (`Engine.embed_spans`).
SpanPooler = Callable[[PackedBatch, np.ndarray], np.ndarray]


class Ready:
    """A result already computed (span pooling and outputs run to completion on the engine
    thread)."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def ready(self) -> bool:
        return True

    def wait(self) -> Any:
        return self.rows


def is_ready(handle: ResultHandle) -> bool:
    try:
        return handle.ready()
    except Exception:
        return False  # `_finish` asks again (`wait`) and fails the batch


class EngineLike(Protocol):
    """What the service needs of `embedserve.engine.engine.Engine` (tests pass fakes)."""

    @property
    def output_width(self) -> int: ...  # columns of a row step() returns (1: a scoring model)
    def check(self, batch: PackedBatch) -> None: ...
    def step(self, batch: PackedBatch) -> ResultHandle: ...
