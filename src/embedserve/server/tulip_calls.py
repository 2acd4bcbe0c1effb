"""The engine behind Tulip (`native/src/tulip`), and the gateway's calls queued there.

`serve --native` (`cli/native.py`) has one queue and one engine thread, Tulip's: the requests
Ivy answers natively are queued there in Rust, and so are the Python front's, whose pipeline
calls this module's `TulipCalls` as its replica (`gateway.replicas.IN_PROCESS`), with the wire
codec's messages, so the request core and the answers are the ones every replica gives.

`packed_step(engine)` is what Tulip calls: int32 bytes in, the engine's handle out, not waited on.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np

from embedserve.contract.codec import decode_request, encode_response
from embedserve.contract.local import rpc_error


def packed_step(engine: Any) -> Any:
    """`step(ids, cu_seqlens)` over little-endian int32 bytes, as Tulip calls it: the engine's
    packed batch built from them, its handle returned without waiting."""
    from embedserve.engine.batch import PackedBatch

    def step(ids: bytes, cu_seqlens: bytes) -> Any:
        cu = np.frombuffer(cu_seqlens, "<i4")
        batch = PackedBatch.from_packed(
            np.frombuffer(ids, "<i4").astype(np.int64), np.diff(cu).astype(np.int32)
        )
        return engine.step(batch)

    return step


class TulipCalls:
    """The (embed, check) calls of a replica in this process whose queue is a native
    `Gateway`'s (set as `gateway` once it is built): dense pooled rows only, the head applied
    here as a server applies it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, width: int, output_rules: str) -> None:
        self.loop = loop
        self.width = width  # the pooled rows' (the model's hidden size)
        self.output_rules = output_rules
        self.gateway: Any = None

    async def embed(self, request: Any, timeout: float | None = None) -> Any:
        try:
            wire = decode_request(request, self.width, self.output_rules)
        except ValueError as e:
            raise rpc_error(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        if wire.spans is not None or wire.outputs or len(wire.second_segment):
            raise rpc_error(
                grpc.StatusCode.UNIMPLEMENTED,
                "the native front's queue takes pooled rows of whole sequences; spans, pairs "
                "and retrieval outputs are served without --native",
            )
        cu = np.zeros(len(wire.seqlens) + 1, dtype="<i4")
        np.cumsum(wire.seqlens, out=cu[1:])
        answer: asyncio.Future[Any] = self.loop.create_future()

        def settle(*result: Any) -> None:  # on the loop's thread
            if not answer.done():
                answer.set_result(result)

        def done(*result: Any) -> None:  # on the thread that resolved the batch
            self.loop.call_soon_threadsafe(settle, *result)

        if not self.gateway.submit(wire.input_ids.tobytes(), cu.tobytes(), done):
            raise rpc_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "the queue is full: retry after a moment"
            )
        try:
            async with asyncio.timeout(timeout):
                rows, width, queue_s, inference_s, error = await answer
        except TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        if error is not None:
            raise rpc_error(grpc.StatusCode.INTERNAL, f"engine failure: {error}")
        pooled = np.frombuffer(rows, dtype="<f4").reshape(-1, width)
        response = encode_response(pooled, wire.head)
        response.queue_seconds, response.inference_seconds = queue_s, inference_s
        return response

    async def check(self, request: Any, timeout: float | None = None) -> Any:
        """Always SERVING: the process serves while it runs."""
        from grpc_health.v1 import health_pb2

        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
