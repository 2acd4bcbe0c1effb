"""The Embed service with every step on the event loop's thread (`serve --one-process`).

`EmbedService` runs its engine on a thread of its own, so its loop never waits on a forward. In
one process that holds both the gateway and a CPU engine (`cli/one_process.py`) the loop's thread
builds the engine and runs each step itself: a lone query then crosses neither a process nor a
thread between the HTTP request and its forward. Measured on a 2-core AMD EPYC Zen 5, one short
query over HTTP, each server alone: `serve` 1.25 ms over `Embedder.encode` in process, this shape
0.84 ms (results/studies/one-process-cpu2-20261205, a prototype of it).

While a step runs the loop reads nothing; the requests that arrived meanwhile are read after it,
each over a few turns of the loop (its body, its tokens) before it queues. So a batch also waits,
turn by turn, while the process holds more requests (`in_process`, the gateway's in flight) than
are queued, or the first of them would run alone and the others behind it (4 clients on 2 cores:
every batch of one, 282 requests/s against `serve`'s 407). The batch wait is the service's rule
(`EmbedService._gather`), kept without blocking the loop: a timer, or a look each turn, until its
deadline. A step is bounded by the batch budget (on the CPU, 0.25 s of work, timed at start-up),
so a large request delays others by at most one step, as on the engine thread.

CPU engines only: there a step is complete on return (a GPU's step returns before the device is
done, and stepping it on the loop would serialize what the engine thread overlaps).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from embedserve.server.engine_thread import EngineThread
from embedserve.server.service import EmbedService
from embedserve.server.trim import TRIM_AFTER_TOKENS, release_free_memory

# loop turns a batch waits, looking each turn, for requests this process holds that have not
# queued, while none queues: a request read in this process queues within a few turns (its body,
# its tokens); one that does not (a slow upload, /health, a slow reader) must neither hold every
# batch to the batch wait's deadline nor spin the loop until it (faults IV)
PATIENT_TURNS = 16


class InlineService(EmbedService):
    """`EmbedService` stepping its engine on the event loop's thread (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As `EmbedService`'s."""
        super().__init__(*args, **kwargs)
        self._timer: asyncio.Handle | None = None
        # requests in this process that may still queue (`serve --one-process`: the gateway's in
        # flight, set by the process that holds both); none by default
        self.in_process: Callable[[], int] = lambda: 0
        self._patience = (0, 0)  # (requests queued when last looked, turns looked since then)

    async def start(self, engine_thread: EngineThread | None = None) -> None:
        """Start answering on this loop: the engine must have been built on its thread (one
        OpenMP team: `server/engine_thread.py`); `engine_thread` is not used."""
        if not self.engine.on_cpu:
            raise ValueError("a service that steps on the event loop's thread is for the CPU")
        self._loop = asyncio.get_running_loop()
        # a result that is not complete on return (none on the CPU) is still answered
        self._results_thread.start()

    async def stop(self) -> None:
        """No new requests; those still queued fail as UNAVAILABLE. No step is running: each
        runs to its end on this thread."""
        left = self.refuse_work()
        if self._timer is not None:
            self._timer.cancel()
        self._launched.put(None)
        await asyncio.to_thread(self._results_thread.join)
        await asyncio.sleep(0)  # the answers posted by the results thread are delivered
        self._unavailable(left)

    def _wake_engine(self) -> None:
        """Once per loop turn in which requests queued: run the next batch now, or at the batch
        wait's deadline (a timer), whichever `_due` says."""
        self._wake_due = False
        self._run_due()

    def _run_due(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with self._work:
            if self._stopping or not len(self.scheduler):
                return
            wait = self._due()
            if wait is None:  # more are on their way through this loop: look again next turn
                self._timer = self._loop.call_soon(self._run_due)
                return
            if wait > 0:
                self._timer = self._loop.call_later(wait, self._run_due)
                return
            batch = self.scheduler.next_batch()
            if not batch:  # every waiting request had been cancelled
                return
            self._in_flight += 1
        self._step(batch, self._answer_now)
        if len(self.scheduler):
            if not self._wake_due:  # read what came meanwhile first
                self._wake_due = True
                self._loop.call_soon(self._wake_engine)
        elif self._tokens_since_trim >= TRIM_AFTER_TOKENS:  # idle after much work
            self._tokens_since_trim = 0
            release_free_memory()

    def _due(self) -> float | None:
        """Seconds to wait before the next batch (None: look again next turn), under the lock:
        none past the batch wait's deadline or with a batch's tokens queued; next turn while
        this process holds requests not yet queued; else `_gather`'s rule."""
        left = self._wait_left()
        if left <= 0 or self.scheduler.num_queued_tokens >= self.scheduler.config.max_batch_tokens:
            return 0.0
        queued = len(self.scheduler)
        if self.in_process() > queued:
            seen, turns = self._patience
            turns = turns + 1 if queued == seen else 1
            self._patience = (queued, turns)
            if turns <= PATIENT_TURNS:
                return None
        return 0.0 if self._batch_full() else left

    @staticmethod
    def _answer_now(callback: Any, *args: Any) -> None:
        """`post` on the loop's own thread: the answers are set at once."""
        callback(*args)
