"""The gRPC Embed service in front of one engine: queue, batch loop, per-request results.

The loop reads in three steps: form a batch (`Scheduler.next_batch`), launch it on the engine
thread (`Engine.step` returns a `LazyTensor` without waiting for the device), and resolve each
request of the batch when its handle is ready. Up to `max_in_flight` batches are launched and not
yet resolved, so batch N+1 is formed and launched while batch N is still on the device. The event
loop never runs the model: `step()` runs on one engine thread, waiting on a result on another.
Span (late-chunking) requests take the same queue, in batches of their own, run by `span_pooler`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import grpc
import numpy as np

from embedserve.contract import EmbedResponse
from embedserve.engine.batch import PackedBatch, check_spans
from embedserve.inputs import Head, check_head
from embedserve.server.scheduler import (
    Overloaded,
    Pending,
    Scheduler,
    SchedulerConfig,
    pack,
    pack_spans,
    split_batch_rows,
)

log = logging.getLogger("embedserve.server")


class ResultHandle(Protocol):
    def ready(self) -> bool: ...
    def wait(self) -> np.ndarray: ...


# Late chunking: run a batch through the model and mean-pool each [start, end) span of its packed
# tokens: [K, H] float32 (`Engine.embed_spans`).
SpanPooler = Callable[[PackedBatch, np.ndarray], np.ndarray]


class Ready:
    """A result already computed (span pooling runs to completion on the engine thread)."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def ready(self) -> bool:
        return True

    def wait(self) -> np.ndarray:
        return self.rows


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the batch loop was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _is_ready(handle: ResultHandle) -> bool:
    try:
        return handle.ready()
    except Exception:
        return False  # `_resolve` asks again and fails the batch


class EngineLike(Protocol):
    """What the service needs of `embedserve.engine.engine.Engine` (tests pass fakes)."""

    @property
    def hidden_size(self) -> int: ...
    def check(self, batch: PackedBatch) -> None: ...
    def step(self, batch: PackedBatch) -> ResultHandle: ...


# Past this many queued requests a batch goes without waiting: the fixed cost of a forward is
# then shared well enough, and at high concurrency the clients' round trip can exceed the wait.
BATCH_WAIT_MAX_REQUESTS = 4


class RequestFailed(Exception):
    """A request's failure, with the status code every transport answers it with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_request(
    request: Any, hidden_size: int, output_rules: str = "generic"
) -> tuple[PackedBatch, Head, np.ndarray | None]:
    """Decode and check one EmbedRequest, once: its packed batch, its head and its spans (or
    None). Raises ValueError with a message for the client."""
    raw = request.input_ids
    if len(raw) % 4:
        raise ValueError(f"input_ids has {len(raw)} bytes, not a whole number of int32s")
    batch = PackedBatch.from_packed(np.frombuffer(raw, dtype="<i4"), np.asarray(request.seqlens))
    spans = None
    if len(request.span_bounds):
        bounds = np.asarray(request.span_bounds, dtype=np.int64)
        if bounds.size % 2:
            raise ValueError(f"span_bounds has {bounds.size} entries, not [start, end) pairs")
        spans = check_spans(bounds.reshape(-1, 2), batch)
    head = check_head(
        hidden_size,
        output_rules,
        request.dimensions or None,
        bool(request.normalize),
        request.output_dtype or "float32",
    )
    return batch, head, spans


def build_response(pooled: np.ndarray, head: Head) -> Any:
    """Apply a request's head to its pooled rows [s, H]; raw little-endian bytes out."""
    out = head.apply(pooled)
    out = np.ascontiguousarray(out, dtype=out.dtype.newbyteorder("<"))
    return EmbedResponse(embeddings=out.tobytes(), shape=list(out.shape), dtype=out.dtype.name)


class EmbedService:
    def __init__(
        self,
        engine: EngineLike,
        config: SchedulerConfig,
        *,
        max_in_flight: int = 2,
        batch_wait: float = 0.0,
        output_rules: str = "generic",
        span_pooler: SpanPooler | None = None,
    ) -> None:
        """`output_rules`: the model's (`ModelSpec.output_rules`), for int8/binary outputs and
        the smallest `dimensions` served. `span_pooler`: how span (late-chunking) requests run;
        without it they are refused."""
        if batch_wait < 0:
            raise ValueError(f"batch_wait must be >= 0 seconds, got {batch_wait}")
        self.engine = engine
        self.scheduler = Scheduler(config)
        self.max_in_flight = max_in_flight
        self.batch_wait = batch_wait
        self.output_rules = output_rules
        self.span_pooler = span_pooler
        self._engine_free_at = 0.0
        self._expected = 0  # requests likely waiting soon (see _next_batch)
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix="engine")
        self._wait_thread = ThreadPoolExecutor(1, thread_name_prefix="results")
        self._loop_task: asyncio.Task[None] | None = None
        self._resolving: set[asyncio.Task[None]] = set()
        self.num_batches = 0

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(self.max_in_flight)
        self._loop_task = asyncio.create_task(self._run(), name="batch-loop")

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await asyncio.gather(*self._resolving, return_exceptions=True)
        self._engine_thread.shutdown(wait=True)
        self._wait_thread.shutdown(wait=True)

    async def embed(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """The gRPC method: `answer`, its failure as the call's status."""
        try:
            return await self.answer(request)
        except RequestFailed as e:
            await context.abort(e.code, str(e))

    async def answer(self, request: Any) -> Any:
        """One EmbedRequest's EmbedResponse, whatever the transport; raises RequestFailed.
        Cancelling the caller's task drops the request (before the engine if still queued)."""
        try:
            batch, head, spans = parse_request(request, self.engine.hidden_size, self.output_rules)
            if spans is not None and self.span_pooler is None:
                raise ValueError("this server does not pool spans (late chunking)")
            # Bad ids or over-long sequences are refused here, alone, so they never fail a batch.
            self.engine.check(batch)
        except ValueError as e:
            raise RequestFailed(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            self.scheduler.submit(Pending(batch, head, spans, future))
        except Overloaded as e:
            raise RequestFailed(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)) from None
        self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:
            future.cancel()  # the client went away: the batch loop drops it
            raise

    async def _next_batch(self) -> list[Pending]:
        """The next batch, once there is work.

        With `batch_wait` > 0, it also waits, at most `batch_wait` seconds after the engine took
        the previous batch, until as many requests wait as were waiting then plus the previous
        batch's (or BATCH_WAIT_MAX_REQUESTS): the clients just answered tend to come back at
        once, and on a device where a forward has a large fixed cost (the CPU) one batch of them
        all is much cheaper than a batch of the first and then another of the rest. One client
        alone never waits.
        """
        loop = asyncio.get_running_loop()
        while True:
            while not len(self.scheduler):
                self._wakeup.clear()
                await self._wakeup.wait()
            deadline = self._engine_free_at + self.batch_wait
            budget = self.scheduler.config.max_batch_tokens
            while (
                len(self.scheduler) < min(self._expected, BATCH_WAIT_MAX_REQUESTS)
                and self.scheduler.num_queued_tokens < budget
                and (left := deadline - loop.time()) > 0
            ):
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), left)
                except TimeoutError:
                    break
            batch = self.scheduler.next_batch()
            if batch:  # else every waiting request had been cancelled
                return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()
            batch = await self._next_batch()
            try:
                handle = await self._on_engine_thread(batch)
            except Exception as e:
                self._slots.release()
                self._fail(batch, e)
                continue
            finally:
                self._engine_free_at = loop.time()
                self._expected = len(self.scheduler) + len(batch)
            self.num_batches += 1
            if _is_ready(handle):  # the CPU engine: resolve now, without a task of its own
                self._answer(batch, handle)
                continue
            task = asyncio.create_task(self._resolve(batch, handle))
            self._resolving.add(task)
            task.add_done_callback(self._resolving.discard)

    def _on_engine_thread(self, batch: list[Pending]) -> asyncio.Future[ResultHandle]:
        """`_launch(batch)` on the engine thread; its result posted straight back to the loop
        (one `call_soon_threadsafe`, not `run_in_executor`'s chained futures)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ResultHandle] = loop.create_future()

        def work() -> None:
            try:
                handle = self._launch(batch)
            except BaseException as e:
                loop.call_soon_threadsafe(_settle, future, None, e)
            else:
                loop.call_soon_threadsafe(_settle, future, handle, None)

        self._engine_thread.submit(work)
        return future

    def _launch(self, batch: list[Pending]) -> ResultHandle:
        packed = pack(batch)
        if batch[0].spans is not None and self.span_pooler is not None:
            # whole documents through the model once, then one mean per span (eager, see
            # `engine.spans`): documents are long and few, so launches do not dominate
            return Ready(self.span_pooler(packed, pack_spans(batch)))
        return self.engine.step(packed)

    async def _resolve(self, batch: list[Pending], handle: ResultHandle) -> None:
        try:
            if handle.ready():
                pooled = handle.wait()
            else:
                loop = asyncio.get_running_loop()
                pooled = await loop.run_in_executor(self._wait_thread, handle.wait)
        except Exception as e:
            self._fail(batch, e)
            self._slots.release()
            return
        self._answer(batch, handle, pooled)

    def _answer(
        self, batch: list[Pending], handle: ResultHandle, pooled: np.ndarray | None = None
    ) -> None:
        """Answer each request of a batch whose handle is ready; releases the batch's slot."""
        try:
            if pooled is None:
                pooled = handle.wait()
            for request, rows in zip(batch, split_batch_rows(pooled, batch), strict=True):
                if not request.result.done():
                    request.result.set_result(build_response(rows, request.head))
        except Exception as e:
            self._fail(batch, e)
        finally:
            self._slots.release()

    def _fail(self, batch: list[Pending], error: Exception) -> None:
        if isinstance(error, ValueError):
            failure = RequestFailed(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        else:
            log.exception("engine failure on a batch of %d requests", len(batch), exc_info=error)
            failure = RequestFailed(
                grpc.StatusCode.INTERNAL, f"engine failure: {type(error).__name__}: {error}"
            )
        for request in batch:
            if not request.result.done():
                request.result.set_exception(failure)
