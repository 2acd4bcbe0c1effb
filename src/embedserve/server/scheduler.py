"""The server's queue: two lanes, each first come, first served, cut into batches of whole
requests under a token budget (small requests may pass a large one of their lane once).

Priority lanes (issue 56): a request is interactive or bulk as its gateway marked it
(`EmbedRequest.lane`, the rule in `core.lanes`). At every batch boundary the interactive lane
goes first; the bulk lane keeps a minimum share: while both wait, at least one batch in
`BULK_EVERY` is bulk's, so a constant stream of queries never starves an index job. With lanes
off (`--lanes off`) every request queues in the one lane, as before.

Pure bookkeeping (no event loop, no torch), so it is unit-tested on its own. The service puts each
request in with `submit`, and the batch loop takes batches out with `next_batch`; requests whose
client went away (`Pending.cancelled()`) are dropped there, before they reach the engine.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embedserve.contract.tracing import RequestTrace, current_request
from embedserve.core.budget import budget_groups, is_small, shift_spans
from embedserve.core.head import Head
from embedserve.engine.batch import PackedBatch

# A request is large when it takes more than half a batch's budget (a large request's parts take
# a whole budget each), small by `core.budget.is_small`.
# how far behind a large request small ones are looked for (a scan of the deque per batch)
BYPASS_SCAN = 256
# the bulk lane's minimum share: while interactive work waits too, one batch in this many is bulk
BULK_EVERY = 4


class Overloaded(Exception):
    """The queue holds too many tokens; the caller should refuse the request (RESOURCE_EXHAUSTED)."""


@dataclass(eq=False)
class Pending:
    """One request waiting for the engine, checked once when it arrived."""

    batch: PackedBatch  # the request's own sequences (a batch of this request alone reuses it)
    head: Head | None  # None: the pooled float32 rows as they are (a raw request)
    # Late chunking: [num_spans, 2] int64 [start, end) token offsets into `batch`, or None for
    # one pooled row per sequence. A batch holds requests of one kind only.
    spans: np.ndarray | None
    # the answer; done once answered, failed or cancelled (the client went away)
    result: asyncio.Future[Any]
    arrived: float = field(default_factory=time.perf_counter)  # when it was queued
    taken: float = 0.0  # when a batch took it (perf_counter), for its answer's timings
    # its tokens count against the queue budget (`Scheduler.cancel` gives them back at once)
    counted: bool = field(default=False, repr=False)
    # the traced server call it belongs to (`contract.tracing`, `--otlp-endpoint`), else None
    trace: RequestTrace | None = field(default_factory=current_request)
    # a sparse / multi-vector model's outputs (dense, sparse, multivector), its side (query) and
    # per sequence its attended leading tokens (None: all); () : one pooled row per sequence
    outputs: tuple[str, ...] = ()
    query: bool = False
    visible: tuple[int, ...] | None = None
    bulk: bool = False  # its lane (`EmbedRequest.lane`): bulk, else interactive

    @property
    def kind(self) -> tuple[object, ...]:
        """Requests share a batch only when of one kind: pooled rows, spans, or one set of
        outputs on one side (the engine runs a batch's outputs in one forward)."""
        if self.outputs:
            return ("outputs", self.outputs, self.query)
        return ("spans",) if self.spans is not None else ("rows",)

    @property
    def num_tokens(self) -> int:
        return self.batch.num_tokens

    @property
    def num_rows(self) -> int:
        """Rows of the answer: one per span, else one per sequence."""
        return self.batch.num_seqs if self.spans is None else int(self.spans.shape[0])

    def cancelled(self) -> bool:
        return bool(self.result.done())


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_tokens: int = 16384
    max_queued_tokens: int = 262144
    lanes: bool = True  # False: one FCFS lane for every request (`--lanes off`)

    def __post_init__(self) -> None:
        if self.max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {self.max_batch_tokens}")
        if self.max_queued_tokens <= 0:
            raise ValueError(f"max_queued_tokens must be positive, got {self.max_queued_tokens}")


@dataclass(eq=False)
class _Lane:
    """One lane's requests in arrival order."""

    queue: deque[Pending] = field(default_factory=deque)
    passed: bool = False  # its last batch passed the large request at its front


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._interactive, self._bulk = _Lane(), _Lane()
        self.num_queued_tokens = 0
        self.num_dropped = 0
        self.num_bulk_batches = 0  # batches taken from the bulk lane
        self._bulk_skipped = 0  # batches given to the interactive lane while bulk waited

    def __len__(self) -> int:
        return len(self._interactive.queue) + len(self._bulk.queue)

    def submit(self, request: Pending) -> None:
        """Queue a request in its lane, or raise Overloaded when it would push the queue (both
        lanes) over its budget.

        A request alone in an empty queue is always taken, however large: otherwise it could
        never run (the gateway bounds request sizes).
        """
        queued = self.num_queued_tokens
        if queued and queued + request.num_tokens > self.config.max_queued_tokens:
            raise Overloaded(
                f"server queue is full ({queued} tokens waiting, limit "
                f"{self.config.max_queued_tokens}); retry later"
            )
        lane = self._bulk if request.bulk and self.config.lanes else self._interactive
        lane.queue.append(request)
        self.num_queued_tokens += request.num_tokens
        request.counted = True

    def cancel(self, request: Pending) -> None:
        """The client of a queued request went away: its tokens leave the budget now.

        NOTE: it stays in the queue until it reaches the front (removing it from the middle of
        a deque costs a scan); until this, its tokens counted there too, so under client
        timeouts new work was refused (429) while the live work queued was small.
        """
        if request.counted:
            request.counted = False
            self.num_queued_tokens -= request.num_tokens

    def next_batch(self) -> list[Pending]:
        """The next batch: the interactive lane's, unless it is empty or the bulk lane has waited
        `BULK_EVERY - 1` batches (then the bulk lane's). Returns an empty list when nothing is
        waiting."""
        interactive, bulk = self._live(self._interactive), self._live(self._bulk)
        if interactive and not (bulk and self._bulk_skipped >= BULK_EVERY - 1):
            self._bulk_skipped = self._bulk_skipped + 1 if bulk else 0
            return self._lane_batch(self._interactive)
        if bulk:
            self._bulk_skipped = 0
            self.num_bulk_batches += 1
            return self._lane_batch(self._bulk)
        return []

    def _live(self, lane: _Lane) -> bool:
        """Whether `lane` holds a request whose client is still there (cancelled ones at its
        front are dropped)."""
        while lane.queue and lane.queue[0].cancelled():
            self._pop(lane)
            self.num_dropped += 1
        return bool(lane.queue)

    def _lane_batch(self, lane: _Lane) -> list[Pending]:
        """Whole requests of `lane` in arrival order until the next one would pass
        `max_batch_tokens`.

        One exception: when a large request is at the front and small ones wait behind it, the
        small ones (of one kind, under the budget) go first, once: the batch after is the large
        one's. So a query waits for at most the one large batch on the engine (on a CPU a batch
        of 2,048 tokens takes 0.4 s to a second of float32 on 2 cores) rather than for every part of a large request
        queued before it, and a large request is delayed by at most one small batch per batch.

        A request larger than the budget runs alone. Requests of different kinds (plain, span
        (late-chunking), outputs: `Pending.kind`) never share a batch: a batch ends where the
        kind changes. Cancelled requests are dropped.
        """
        small = [] if lane.passed else self._small_behind(lane)
        lane.passed = bool(small)
        if small:
            return small
        kind = lane.queue[0].kind

        def sizes() -> Iterator[int]:
            for request in lane.queue:
                if request.kind != kind:
                    return
                yield request.num_tokens

        groups = budget_groups(sizes(), self.config.max_batch_tokens)
        taken = [self._pop(lane) for _ in next(groups)]
        batch = [r for r in taken if not r.cancelled()]
        self.num_dropped += len(taken) - len(batch)
        return batch

    def _small_behind(self, lane: _Lane) -> list[Pending]:
        """The small requests waiting behind a large one at the lane's front, taken out of it
        (none when the front is small)."""
        budget = self.config.max_batch_tokens
        if lane.queue[0].num_tokens * 2 <= budget:
            return []
        taken: list[Pending] = []
        tokens, kind = 0, None
        for request in itertools.islice(lane.queue, 1, BYPASS_SCAN):
            if request.cancelled() or not is_small(request.num_tokens, budget):
                continue
            if kind is None:
                kind = request.kind
            if request.kind != kind or tokens + request.num_tokens > budget:
                break
            taken.append(request)
            tokens += request.num_tokens
        for request in taken:
            lane.queue.remove(request)
            self.cancel(request)  # out of the queue: its tokens leave the budget (once)
        return taken

    def drain(self) -> list[Pending]:
        """Empty the queue; the requests that were in it."""
        left = [*self._interactive.queue, *self._bulk.queue]
        for lane in (self._interactive, self._bulk):
            lane.queue.clear()
        self.num_queued_tokens = 0
        for request in left:
            request.counted = False
        return left

    def _pop(self, lane: _Lane) -> Pending:
        request = lane.queue.popleft()
        self.cancel(request)  # out of the queue: its tokens leave the budget (once)
        return request


def pack(batch: list[Pending]) -> PackedBatch:
    """One packed batch of the requests' sequences, back to back in order."""
    if len(batch) == 1:
        return batch[0].batch
    return PackedBatch.from_packed(
        np.concatenate([r.batch.input_ids for r in batch]),
        np.concatenate([r.batch.seqlens for r in batch]),
        np.concatenate([r.batch.token_type_ids for r in batch]),  # a cross-encoder's pairs
    )


def pack_spans(batch: list[Pending]) -> np.ndarray:
    """[K, 2] spans of a batch of span requests, shifted to their places in `pack(batch)`."""
    if any(r.spans is None for r in batch):
        raise RuntimeError("a batch mixes span requests and plain ones")
    return shift_spans([r.spans for r in batch], [r.num_tokens for r in batch])
