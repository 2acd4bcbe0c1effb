"""The engine behind Tulip (`native/src/tulip`), and the gateway's calls queued there.

`serve --native` (`cli/native.py`) has one queue and one engine thread, Tulip's: the requests
Ivy answers natively are queued there in Rust, and so are the Python front's, whose pipeline
calls this module's `TulipCalls` as its replica (`gateway.replicas.IN_PROCESS`), with the wire
codec's messages, so the request core and the answers are the ones every replica gives; each
call goes into Tulip's lane its request's (`EmbedRequest.lane`, `core.lanes`).

`packed_step(engine)` is what Tulip calls: the packed batch's arrays in, built in Rust
(`tulip::BatchArrays`), the engine's handle out, not waited on; `sparse_step(seam)` the same
arrays in, a sparse model's vectors out (TEI's `/embed_sparse` answered by Ivy). `Watch` puts
each under the server's engine guard (`server.guard`: failures in a row, an error the device
cannot recover from, or a step stuck past its timeout end the process) and counts them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import grpc
import numpy as np

from embedserve.contract import tracing
from embedserve.contract.local import rpc_error
from embedserve.engine.batch import PackedBatch


def _packed(arrays: tuple[bytearray, ...]) -> PackedBatch:
    """The engine's `PackedBatch` around the arrays Tulip built, its fields in order as
    little-endian bytearrays (`tulip::BatchArrays`): views, no copy. NOTE: written out rather
    than a generator over the types: 2.9 against 5.7 us, once per batch."""
    ids, seqlens, cu_seqlens, positions, seq_ids, token_types = arrays
    view = np.frombuffer
    return PackedBatch(
        view(ids, "<i8"),
        view(seqlens, "<i4"),
        view(cu_seqlens, "<i4"),
        view(positions, "<i8"),
        view(seq_ids, "<i8"),
        view(token_types, "<i8"),
    )


def packed_step(engine: Any) -> Any:
    """`step(*arrays)` as Tulip calls it: the engine's `PackedBatch` wrapped around the arrays
    Rust built (views, no copy: the engine's `check` still reads them), its handle returned
    without waiting. NOTE: the arrays are built in Rust because NumPy's dozen calls per batch
    were ~40 us of the engine thread, a short request's whole share with no model."""

    def step(*arrays: bytearray) -> Any:
        return engine.step(_packed(arrays))

    return step


# a key per batch on the engine, for the guard's watchdog (`EngineGuard.begin`)
_KEYS = itertools.count()


class Watch:
    """The engine's calls under the server's engine guard, counted (`num_batches`: the batches
    launched, as a server's metrics count them)."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard
        self.num_batches = 0

    def __call__(self, call: Any) -> Any:
        """`call` (a step, a sparse step, a batch's work) with each call on the engine, under the
        guard, from its start until it returns, or, when it returns a handle (a step's), until
        the handle's `wait()` does; a failure counted (a ValueError, the client's, is not), a
        success resetting the count."""
        guard = self.guard

        def run(*args: Any) -> Any:
            self.num_batches += 1  # the engine thread's alone: no lock
            key = next(_KEYS)
            guard.begin(key, time.perf_counter())
            try:
                out = call(*args)
            except BaseException as e:
                guard.end(key)
                guard.failed(e)
                raise
            if hasattr(out, "wait"):
                return _Waited(out, guard, key)
            guard.end(key)
            guard.succeeded()
            return out

        return run


class _Waited:
    """A step's handle whose `wait()` ends its batch's time on the engine for the guard."""

    __slots__ = ("guard", "handle", "key")

    def __init__(self, handle: Any, guard: Any, key: int) -> None:
        self.handle, self.guard, self.key = handle, guard, key

    def wait(self) -> Any:
        try:
            rows = self.handle.wait()
        except BaseException as e:
            self.guard.end(self.key)
            self.guard.failed(e)
            raise
        self.guard.end(self.key)
        self.guard.succeeded()
        return rows


def sparse_step(seam: Any) -> Any:
    """`sparse(*arrays) -> (offsets, indices, values)` as Tulip calls it for Ivy's sparse
    requests: the engine's sparse outputs of the batch as a document's (TEI's `/embed_sparse`:
    no query side, every token seen; `retrieval.inputs.prepare_outputs`), as little-endian
    int64, int64 and float32 bytes. Eager: the engine waits for its device."""

    def sparse(*arrays: bytearray) -> tuple[bytes, bytes, bytes]:
        rows = seam.outputs_encoder(_packed(arrays), ("sparse",), query=False).sparse
        return (
            rows.offsets.astype("<i8").tobytes(),
            rows.indices.astype("<i8").tobytes(),
            rows.values.astype("<f4").tobytes(),
        )

    return sparse


class TulipCalls:
    """The (embed, check) calls of a replica in this process whose queue is a native
    `Gateway`'s (set as `gateway` once it is built; `seam`, the engine's record, set on Tulip's
    engine thread when it builds the engine). Each request is checked as a server checks it
    (`service.checked`). Pooled rows of whole sequences go into Tulip's batches beside Ivy's own
    requests; spans and a retrieval model's outputs are a call of their own (`Gateway.call`),
    run alone on the engine thread as the server runs a batch of one kind (`service.launch`).
    The answers are the server's (`service.answers_of`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, model: int = 0) -> None:
        self.loop = loop
        self.model = model  # its place among the gateway's models: its Tulip
        self.gateway: Any = None
        self.seam: Any = None
        self.multivector_limit: Any = None
        self.launch: Any = None  # `service.launch` under the engine guard (`Watch`), once built

    async def embed(self, request: Any, timeout: float | None = None) -> Any:
        """The server's answer to `request`, as its gRPC call gives it (`service.answer`), its
        spans made as a server makes them when the gateway's span sent its context."""
        if tracing.TRACER is None or not request.traceparent:
            return await self._embed(request, timeout)
        with tracing.ServerCall(request.traceparent, request.request_id) as span:
            span.service = tracing.SERVER_SERVICE  # this process's gateway spans are its own
            response = await self._embed(request, timeout)
            tracing.engine_step_before(span, response.inference_seconds, sum(request.seqlens))
            return response

    async def _embed(self, request: Any, timeout: float | None) -> Any:
        from embedserve.server.service import checked

        if timeout is not None and timeout <= 0:  # no time left: never queued (gRPC's rule)
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        answer: asyncio.Future[Any] = self.loop.create_future()
        try:
            pending = checked(self.seam, request, answer, self.multivector_limit)
        except ValueError as e:
            raise rpc_error(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        if pending.outputs or pending.spans is not None:
            queued = self.gateway.call(
                self._work(pending), pending.num_tokens, pending.bulk, self.model
            )
        else:
            queued = self._submit(pending)
        if not queued:
            raise rpc_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "the queue is full: retry after a moment"
            )
        try:
            async with asyncio.timeout(timeout):
                response, error = await answer
        except TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        if error is not None:
            raise rpc_error(grpc.StatusCode.INTERNAL, f"engine failure: {error}")
        return response

    def _settle(self, pending: Any, response: Any, error: Any) -> None:
        """From any thread: the request's (response, error), once."""

        def settle() -> None:
            if not pending.result.done():
                pending.result.set_result((response, error))

        self.loop.call_soon_threadsafe(settle)

    def _submit(self, pending: Any) -> bool:
        """Pooled rows: the packed ids into Tulip's batches; the rows answered here."""
        from embedserve.server.service import answers_of

        batch = pending.batch

        def done(rows: Any, width: int, queue_s: float, inference_s: float, error: Any) -> None:
            if error is not None:
                self._settle(pending, None, error)
                return
            try:
                response = answers_of(np.frombuffer(rows, "<f4").reshape(-1, width), [pending])[0]
            except Exception as e:  # an answer that cannot be encoded fails this request alone
                self._settle(pending, None, repr(e))
                return
            response.queue_seconds, response.inference_seconds = queue_s, inference_s
            self._settle(pending, response, None)

        ids, cu = (
            a.astype("<i4", copy=False).tobytes() for a in (batch.input_ids, batch.cu_seqlens)
        )
        types = batch.token_type_ids  # a cross-encoder's pairs: batched beside everyone else's
        pairs = types.astype("<i4").tobytes() if types.any() else None
        return bool(self.gateway.submit(ids, cu, done, pending.bulk, pairs, self.model))

    def _work(self, pending: Any) -> Any:
        """What the engine thread runs for a batch of its own: launched, waited on, answered."""
        from embedserve.server.service import answers_of, stamp_timings

        def work() -> None:
            pending.taken = time.perf_counter()
            try:
                answers = answers_of(self.launch(self.seam, [pending]).wait(), [pending])
            except Exception as e:  # said to this request's client; the queue goes on
                self._settle(pending, None, repr(e))
                return
            stamp_timings([pending], answers, time.perf_counter())
            self._settle(pending, answers[0], None)

        return work

    async def check(self, request: Any, timeout: float | None = None) -> Any:
        """Always SERVING: the process serves while it runs."""
        from grpc_health.v1 import health_pb2

        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    def outstanding_tokens(self) -> int:
        """The engine's tokens not yet answered, Ivy's requests and these calls both."""
        if self.gateway is None:
            return 0
        return int(self.gateway.outstanding_tokens(self.model))
