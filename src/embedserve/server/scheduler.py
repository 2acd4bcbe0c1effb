"""The server's queue: first come, first served, batches of whole requests under a token budget.

Pure bookkeeping (no asyncio, no torch), so it is unit-tested on its own. The service puts each
request in with `submit`, and the batch loop takes batches out with `next_batch`; requests whose
client went away (`Pending.is_cancelled()`) are dropped there, before they reach the engine.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class Overloaded(Exception):
    """The queue holds too many tokens; the caller should refuse the request (RESOURCE_EXHAUSTED)."""


@dataclass
class Pending:
    """One request waiting for the engine."""

    input_ids: np.ndarray  # [num_tokens] int32, every sequence back to back
    seqlens: np.ndarray  # [num_seqs] int32
    dimensions: int
    normalize: bool
    output_dtype: str
    # Late chunking: [num_spans, 2] int64 [start, end) token offsets into `input_ids`, or None
    # for one pooled row per sequence. A batch holds requests of one kind only.
    spans: np.ndarray | None = None
    # Set by the service: where the result goes, and whether the client is still there; and
    # the request's own `PackedBatch`, built when it was checked (reused for a batch of one).
    result: Any = None
    packed: Any = None
    is_cancelled: Callable[[], bool] = field(default=lambda: False)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seqlens.shape[0])

    @property
    def num_rows(self) -> int:
        """Rows of the answer: one per span, else one per sequence."""
        return self.num_seqs if self.spans is None else int(self.spans.shape[0])


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_tokens: int = 16384
    max_queued_tokens: int = 262144

    def __post_init__(self) -> None:
        if self.max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {self.max_batch_tokens}")
        if self.max_queued_tokens <= 0:
            raise ValueError(f"max_queued_tokens must be positive, got {self.max_queued_tokens}")


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._queue: deque[Pending] = deque()
        self.num_queued_tokens = 0
        self.num_dropped = 0

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, request: Pending) -> None:
        """Queue a request, or raise Overloaded when it would push the queue over its budget.

        A request alone in an empty queue is always taken, however large: otherwise it could
        never run (the gateway bounds request sizes).
        """
        queued = self.num_queued_tokens
        if queued and queued + request.num_tokens > self.config.max_queued_tokens:
            raise Overloaded(
                f"server queue is full ({queued} tokens waiting, limit "
                f"{self.config.max_queued_tokens}); retry later"
            )
        self._queue.append(request)
        self.num_queued_tokens += request.num_tokens

    def next_batch(self) -> list[Pending]:
        """Whole requests in arrival order until the next one would pass `max_batch_tokens`.

        A request larger than the budget runs alone. Span (late-chunking) requests and plain ones
        never share a batch: a batch ends where the kind changes. Cancelled requests are
        dropped. Returns an empty list when nothing is waiting.
        """
        batch: list[Pending] = []
        used = 0
        budget = self.config.max_batch_tokens
        while self._queue:
            head = self._queue[0]
            if head.is_cancelled():
                self._pop()
                self.num_dropped += 1
                continue
            if batch and (
                used + head.num_tokens > budget or (head.spans is None) != (batch[0].spans is None)
            ):
                break
            batch.append(self._pop())
            used += head.num_tokens
        return batch

    def _pop(self) -> Pending:
        request = self._queue.popleft()
        self.num_queued_tokens -= request.num_tokens
        return request


def pack(batch: list[Pending]) -> tuple[np.ndarray, np.ndarray]:
    """One batch's token ids [T] and sequence lengths [S], requests back to back in order."""
    if len(batch) == 1:
        return batch[0].input_ids, batch[0].seqlens
    return (
        np.concatenate([r.input_ids for r in batch]),
        np.concatenate([r.seqlens for r in batch]),
    )


def pack_spans(batch: list[Pending]) -> np.ndarray:
    """[K, 2] spans of a batch of span requests, shifted to their places in `pack(batch)`."""
    out, offset = [], 0
    for r in batch:
        if r.spans is None:
            raise RuntimeError("a batch mixes span requests and plain ones")
        out.append(r.spans + offset)
        offset += r.num_tokens
    return out[0] if len(out) == 1 else np.concatenate(out)


def split_rows(pooled: np.ndarray, batch: list[Pending]) -> list[np.ndarray]:
    """The pooled rows [rows, H] of a packed batch, cut back into one array per request."""
    out = []
    start = 0
    for r in batch:
        out.append(pooled[start : start + r.num_rows])
        start += r.num_rows
    if start != pooled.shape[0]:
        raise RuntimeError(f"engine returned {pooled.shape[0]} rows for {start} expected")
    return out
