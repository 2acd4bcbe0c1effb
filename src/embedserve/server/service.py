"""The Embed service in front of one engine: queue, batch loop, per-request results.

Requests arrive on the event loop (gRPC or the local socket), are checked once and queued
(`Scheduler`). Two threads do the rest, so the loop never runs the model and never waits on the
device: the engine thread forms a batch (`Scheduler.next_batch`) and launches it (`Engine.step`
returns a `LazyTensor` without waiting for the device); the results thread waits on each launched
batch in order, encodes each request's answer and posts them to the loop in one wake-up. Up to
`max_in_flight` batches are launched and not yet answered, so batch N+1 is formed and launched
while batch N is still on the device. Span (late-chunking) requests take the same queue, in
batches of their own, run by the engine's `span_pooler`; so do a sparse or multi-vector model's
requests for outputs (its `outputs_encoder`, one forward per batch for every output asked). What
the service reads of the engine is one record (`engine.seam.EngineSeam`). Two
cross-thread wake-ups per batch, where an asyncio batch loop had four (`benchmarks/breakdown.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import grpc
import numpy as np

from embedserve.contract import tracing
from embedserve.contract.codec import decode_request, encode_response, encode_responses
from embedserve.core.head import Head
from embedserve.engine.batch import PackedBatch, check_spans
from embedserve.engine.seam import EngineSeam, ResultHandle
from embedserve.processes import name_os_thread
from embedserve.server.engine_thread import EngineThread
from embedserve.server.guard import EngineGuard
from embedserve.server.handles import Ready, is_ready
from embedserve.server.output_requests import (
    MultivectorLimit,
    OutputsAsk,
    check_asked,
    outputs_answers,
    pack_visible,
)
from embedserve.server.scheduler import (
    Overloaded,
    Pending,
    Scheduler,
    SchedulerConfig,
    pack,
    pack_spans,
)
from embedserve.server.stages import StageTimes
from embedserve.server.trim import TRIM_AFTER_TOKENS, release_free_memory

log = logging.getLogger("embedserve.server")


# Past this many queued requests a batch goes without waiting: the fixed cost of a forward is
# then shared well enough, and at high concurrency the clients' round trip can exceed the wait.
BATCH_WAIT_MAX_REQUESTS = 4


def stamp_timings(batch: list[Pending], answers: list[Any], encoded: float) -> None:
    """Each answer's time in this server: queued until its batch was taken, then the batch's
    run until the answers were encoded (the gateway's TEI timing headers read them)."""
    for request, answer in zip(batch, answers, strict=True):
        if answer is not None:
            answer.queue_seconds = request.taken - request.arrived
            answer.inference_seconds = encoded - request.taken


class RequestFailed(Exception):
    """A request's failure, with the status code every transport answers it with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_request(
    request: Any, output_width: int, output_rules: str = "generic"
) -> tuple[PackedBatch, Head | None, np.ndarray | None, OutputsAsk | None]:
    """Decode and check one EmbedRequest, once: its packed batch, its head (None: raw rows),
    its spans (or None) and the outputs it asks (None: pooled rows). Raises ValueError with a
    message for the client."""
    wire = decode_request(request, output_width, output_rules)
    batch = PackedBatch.from_packed(
        wire.input_ids, wire.seqlens, second_segment=wire.second_segment
    )
    spans = None if wire.spans is None else check_spans(wire.spans, batch)
    asked = (wire.outputs, wire.query, wire.visible) if wire.outputs else None
    return batch, wire.head, spans, asked


def checked(
    engine: EngineSeam,
    request: Any,
    result: asyncio.Future[Any],
    multivector_limit: MultivectorLimit | None = None,
) -> Pending:
    """One EmbedRequest decoded and checked against `engine`, as it is queued (its answer goes
    to `result`). Bad ids or over-long sequences are refused here, alone, so they never fail a
    batch. Raises ValueError with a message for the client."""
    batch, head, spans, asked = parse_request(request, engine.output_width, engine.output_rules)
    if spans is not None and engine.span_pooler is None:
        raise ValueError("this server does not pool spans (late chunking)")
    if asked is not None:
        check_asked(asked[0], engine.outputs_encoder is not None, engine.model_outputs)
    engine.check(batch)
    if asked is not None and "multivector" in asked[0] and multivector_limit:
        multivector_limit.check(batch.input_ids, batch.seqlens, asked[1])
    pending = Pending(batch, head, spans, result, bulk=bool(request.lane))
    if asked is not None:
        pending.outputs, pending.query, pending.visible = asked
    return pending


def launch(engine: EngineSeam, batch: list[Pending]) -> ResultHandle:
    """A batch of one kind (`Pending.kind`) on `engine`: its handle, not waited on."""
    packed, first = pack(batch), batch[0]
    if first.outputs and engine.outputs_encoder is not None:
        # eager and complete on return, as spans: one forward for every output asked
        return Ready(
            engine.outputs_encoder(
                packed, first.outputs, query=first.query, visible_keys=pack_visible(batch)
            )
        )
    if first.spans is not None and engine.span_pooler is not None:
        # whole documents through the model once, then one mean per span (eager, see
        # `engine.spans`): documents are long and few, so launches do not dominate
        return Ready(engine.span_pooler(packed, pack_spans(batch)))
    return engine.step(packed)


def answers_of(pooled: Any, batch: list[Pending]) -> list[Any]:
    """Each request's EmbedResponse from its batch's result (`launch`'s handle, waited on)."""
    if batch[0].outputs:
        return outputs_answers(pooled, batch)
    return encode_responses(pooled, [r.head for r in batch], [r.num_rows for r in batch])


# The answer of a request's pooled rows (`codec.encode_response`), by the name the host-path
# benchmark (benchmarks/host_path_gpu.py) measures it under.
build_response = encode_response


class EmbedService:
    def __init__(
        self,
        engine: EngineSeam,
        config: SchedulerConfig,
        *,
        max_in_flight: int = 2,
        batch_wait: float = 0.0,
        guard: EngineGuard | None = None,
        multivector_limit: MultivectorLimit | None = None,
    ) -> None:
        """`engine`: what the service needs of it (`Engine.seam`; span requests without its
        `span_pooler`, and outputs requests without its `outputs_encoder`, are refused).
        `guard`: told of each batch's outcome and time on the engine, to find an engine that
        can no longer serve (`server.guard`). `multivector_limit`: the bound on a call's
        multi-vector answer (none: unbounded)."""
        if batch_wait < 0:
            raise ValueError(f"batch_wait must be >= 0 seconds, got {batch_wait}")
        self.engine = engine
        self.scheduler = Scheduler(config)
        self.max_in_flight = max_in_flight
        self.batch_wait = batch_wait
        self.guard = guard
        self.multivector_limit = multivector_limit
        # Guards the scheduler, `_in_flight` and `_stopping`, shared by the event loop (which
        # submits) and the engine and results threads (which take batches and free slots).
        self._work = threading.Condition(threading.Lock())
        self._in_flight = 0  # batches launched and not yet answered
        self._stopping = False
        self._engine_free_at = 0.0
        self._expected = 0  # requests likely waiting soon (see _gather)
        self._launched: queue.SimpleQueue[tuple[list[Pending], ResultHandle, float] | None]
        self._launched = queue.SimpleQueue()
        self.stage_times = StageTimes()
        self._results_thread = threading.Thread(
            target=self._await_results, name="results", daemon=True
        )
        self._engine_done: Future[None] | None = None
        self._wake_due = False  # a wake of the engine thread is scheduled on the loop
        self.num_batches = 0
        self._tokens_since_trim = 0  # the engine thread's (see TRIM_AFTER_TOKENS)

    async def start(self, engine_thread: EngineThread | None = None) -> None:
        """Start taking batches on `engine_thread` (the thread the engine was built on; by
        default one of its own) and the results thread."""
        self._loop = asyncio.get_running_loop()
        thread = engine_thread or EngineThread()
        self._engine_done = thread.submit(self._launch_batches)
        if engine_thread is None:  # its own: the thread ends with the service
            thread.close()
        self._results_thread.start()

    async def stop(self) -> None:
        """Finish the batches on the engine; requests still queued fail as UNAVAILABLE."""
        left = self.refuse_work()
        if self._engine_done is not None:
            await asyncio.wrap_future(self._engine_done)
        await asyncio.to_thread(self._results_thread.join)
        await asyncio.sleep(0)  # the answers the threads posted are delivered
        self._unavailable(left)

    def abandon(self) -> None:
        """An engine that cannot serve (`server.guard`): new and queued requests fail as
        UNAVAILABLE (a gateway retries them on another replica) at once, without waiting for
        the engine's threads, which may never return."""
        self._unavailable(self.refuse_work())

    def refuse_work(self) -> list[Pending]:
        """No new requests, no new batches: the requests that were queued."""
        with self._work:
            self._stopping = True
            self._work.notify_all()
            return self.scheduler.drain()

    @staticmethod
    def _unavailable(requests: list[Pending]) -> None:
        gone = RequestFailed(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
        for request in requests:
            if not request.result.done():
                request.result.set_exception(gone)

    async def embed(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """The gRPC method: `answer`, its failure as the call's status."""
        try:
            return await self.answer(request)
        except RequestFailed as e:
            await context.abort(e.code, str(e))

    async def answer(self, request: Any) -> Any:
        """One EmbedRequest's EmbedResponse, whatever the transport; raises RequestFailed.
        Cancelling the caller's task drops the request (before the engine if still queued)."""
        if tracing.TRACER is None or not request.traceparent:
            return await self._answer(request)
        with tracing.ServerCall(
            request.traceparent, request.request_id
        ):  # the gateway's span's child
            return await self._answer(request)

    async def _answer(self, request: Any) -> Any:
        future: asyncio.Future[Any] = self._loop.create_future()
        try:
            pending = checked(self.engine, request, future, self.multivector_limit)
        except ValueError as e:
            raise RequestFailed(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        with self._work:
            if self._stopping:
                raise RequestFailed(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
            try:
                self.scheduler.submit(pending)
            except Overloaded as e:
                raise RequestFailed(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)) from None
        if not self._wake_due:
            self._wake_due = True
            self._loop.call_soon(self._wake_engine)
        try:
            return await future
        except asyncio.CancelledError:
            future.cancel()  # the client went away: the engine thread drops it
            with self._work:
                self.scheduler.cancel(pending)  # and its tokens leave the queue budget now
            raise

    # The engine thread: take a batch, launch it, hand its handle to the results thread (or, when
    # the result is complete at once as on the CPU, answer it here), take the next. The results
    # thread waits on each handle in launch order and answers its requests. Each answer reaches
    # the event loop with one `call_soon_threadsafe`: a request crosses threads twice (loop ->
    # engine, results -> loop), and the wait for the device overlaps the next launch.

    def _wake_engine(self) -> None:
        """The engine thread told of the requests queued since the last wake.

        NOTE: once per turn of the loop, after the requests read in that turn (often from one
        socket buffer) have all queued, so that they start as one batch, not the first alone
        with the rest behind it: on the CPU each forward has a large fixed cost (16 clients on 2
        cores: 410 requests/s, results/concurrency/concurrency-cpu2-peers-20261202-4)."""
        self._wake_due = False
        with self._work:
            self._work.notify()

    def _launch_batches(self) -> None:
        while True:
            if self._tokens_since_trim >= TRIM_AFTER_TOKENS and not len(self.scheduler):
                self._tokens_since_trim = 0
                release_free_memory()  # idle after much work: outside the lock
            if (batch := self._take_batch()) is None:
                break
            self._step(batch, self._post)
        self._launched.put(None)

    def _step(self, batch: list[Pending], post: Callable[..., None]) -> None:
        """Run one taken batch on the engine and answer it through `post` (or hand its handle to
        the results thread, when the device is still working on it)."""
        observe = self.stage_times.observe
        taken = time.perf_counter()
        for request in batch:
            request.taken = taken
            observe("queue", taken - request.arrived)
        if tracing.TRACER is not None:
            tracing.step_started(batch, taken)
        self._tokens_since_trim += sum(r.num_tokens for r in batch)
        if self.guard is not None:
            self.guard.begin(id(batch), taken)
        try:
            handle = self._launch(batch)
        except Exception as e:
            self._release_slot()
            self._batch_failed(batch, e, post)
            return
        finally:
            self._engine_free_at = time.monotonic()
            self._expected = len(self.scheduler) + len(batch)
        launched = time.perf_counter()
        observe("launch", launched - taken)
        self.num_batches += 1
        if is_ready(handle):  # the CPU engine: no second thread hop
            self._finish(batch, handle, launched, post)
        else:
            self._launched.put((batch, handle, launched))

    def _await_results(self) -> None:
        name_os_thread("es-results")
        while (launched := self._launched.get()) is not None:
            self._finish(*launched, self._post)

    def _take_batch(self) -> list[Pending] | None:
        """The next batch once there is work and a free slot; None once stopping."""
        with self._work:
            while True:
                while not self._stopping and not (
                    len(self.scheduler) and self._in_flight < self.max_in_flight
                ):
                    self._work.wait()
                if self._stopping:
                    return None
                self._gather()
                batch = self.scheduler.next_batch()
                if batch:  # else every waiting request had been cancelled
                    self._in_flight += 1
                    return batch

    def _gather(self) -> None:
        """With `batch_wait` > 0, wait (holding the slot, releasing the lock), at most
        `batch_wait` seconds after the engine took the previous batch, until as many requests
        wait as were waiting then plus the previous batch's (or BATCH_WAIT_MAX_REQUESTS): the
        clients just answered tend to come back at once, and on a device where a forward has a
        large fixed cost (the CPU) one batch of them all is much cheaper than a batch of the
        first and then another of the rest. One client alone never waits."""
        while not self._stopping and not self._batch_full() and (left := self._wait_left()) > 0:
            self._work.wait(left)

    def _wait_left(self) -> float:
        """Seconds left of the batch wait: from the engine's last step, `batch_wait`, doubled
        when more clients are expected than the cap. NOTE: they are coming, so waiting longer
        for the cap is cheap (16 clients on a 2-core Zen 5: +16% requests/s at 6 ms against 3,
        where 4 clients lost 7% at 6 ms, waiting on their slowest)."""
        many = self._expected > BATCH_WAIT_MAX_REQUESTS
        return self._engine_free_at + self.batch_wait * (2 if many else 1) - time.monotonic()

    def _batch_full(self) -> bool:
        """As many requests queued as the last batch had (at most BATCH_WAIT_MAX_REQUESTS), or a
        batch's tokens: the wait is over. Under the lock."""
        return (
            len(self.scheduler) >= min(self._expected, BATCH_WAIT_MAX_REQUESTS)
            or self.scheduler.num_queued_tokens >= self.scheduler.config.max_batch_tokens
        )

    def _launch(self, batch: list[Pending]) -> ResultHandle:
        return launch(self.engine, batch)

    def _finish(
        self,
        batch: list[Pending],
        handle: ResultHandle,
        launched: float,
        post: Callable[..., None],
    ) -> None:
        """Wait for a batch's result, encode each request's answer (its head) and `post` them
        all to the event loop; frees the batch's slot."""
        try:
            pooled = handle.wait()
            ready = time.perf_counter()
            answers = answers_of(pooled, batch)
        except Exception as e:
            self._release_slot()
            self._batch_failed(batch, e, post)
        else:
            self._release_slot()
            if self.guard is not None:
                self.guard.end(id(batch))
                self.guard.succeeded()
            encoded = time.perf_counter()
            stamp_timings(batch, answers, encoded)
            if tracing.TRACER is not None:
                tracing.step_finished(batch, ready)
            self.stage_times.observe("device", ready - launched)
            self.stage_times.observe("encode", encoded - ready)
            post(self._deliver, batch, answers, encoded)

    def _batch_failed(
        self, batch: list[Pending], error: Exception, post: Callable[..., None]
    ) -> None:
        post(self._fail, batch, error)
        if self.guard is not None:
            self.guard.end(id(batch))
            self.guard.failed(error)

    def _release_slot(self) -> None:
        with self._work:
            self._in_flight -= 1
            self._work.notify()

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        # a closed loop (RuntimeError): nobody waits for these answers any more
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(callback, *args)

    def _deliver(self, batch: list[Pending], answers: list[Any], posted: float) -> None:
        self.stage_times.observe("deliver", time.perf_counter() - posted)
        for request, answer in zip(batch, answers, strict=True):
            if not request.result.done():
                request.result.set_result(answer)

    @staticmethod
    def _fail(batch: list[Pending], error: Exception) -> None:
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
