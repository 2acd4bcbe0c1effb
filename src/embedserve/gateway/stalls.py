"""When a gateway worker's event loop cannot run: its lag and its garbage collector's pauses.

Every request of a worker waits while its loop runs something else synchronously (a large
request's parsing or answer, a collection of the Python heap). No single request's latency shows
that; these two histograms do, per worker (added up over workers in /metrics):

- `embedserve_gateway_loop_lag_seconds`: how late a timer set every `LAG_INTERVAL` fired;
- `embedserve_gateway_gc_pause_seconds{generation}`: each collection's duration.

The watch is one of the app's `services` (started with the pipelines, stopped before them).
With PYTHONASYNCIODEBUG=1 (asyncio's debug mode, slow: a diagnosis only) each worker also logs
every callback that holds its loop over `LAG_INTERVAL`, by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from typing import Any

# a timer every 10 ms: ~100 wake-ups per second and worker, each a few microseconds
LAG_INTERVAL = 0.01


class LoopWatch:
    def __init__(self, lag: Any, gc_pause: Any) -> None:
        """`lag`: a histogram; `gc_pause`: a histogram labelled by generation."""
        self.lag = lag
        self.gc_pause = gc_pause
        self._task: asyncio.Task[None] | None = None
        self._gc_start = 0.0
        # (generation, seconds) of collections not yet in the histogram. NOTE: a GC callback
        # must not observe into a metric itself: a collection can begin while prometheus_client
        # holds its lock (with several workers one lock for every value, held while a new
        # labelled child's value is made, which allocates), and taking it again from the
        # callback hangs the worker for good (tests/gateway/test_stalls.py). The tick moves them
        # over instead; list.append takes no lock.
        self._pauses: list[tuple[str, float]] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.get_debug():  # asyncio's own threshold, 100 ms, hides most stalls
            loop.slow_callback_duration = LAG_INTERVAL
        self._task = loop.create_task(self._watch())
        gc.callbacks.append(self._on_gc)

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._flush()

    async def _watch(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(LAG_INTERVAL)
            self.lag.observe(max(0.0, time.monotonic() - before - LAG_INTERVAL))
            self._flush()

    def _flush(self) -> None:
        while self._pauses:
            generation, seconds = self._pauses.pop()
            self.gc_pause.labels(generation).observe(seconds)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self._pauses.append((str(info["generation"]), time.perf_counter() - self._gc_start))
