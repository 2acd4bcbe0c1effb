"""The gateway's calls of a service in its own process (`serve --one-process`): the errors and
the deadline the gRPC and local transports give it, with the real service on its loop."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from embedserve.cli.one_process import in_process_calls
from embedserve.server.inline import InlineService
from embedserve.server.scheduler import SchedulerConfig
from tests.server.test_service import FakeEngine, req, rows_of, seam


def with_calls(body: Any, batch_wait: float = 0.0) -> FakeEngine:
    """`body(service, embed, check)` on a fresh loop; the fake engine, for its batches."""
    engine = FakeEngine()

    async def main() -> None:
        service = InlineService(seam(engine), SchedulerConfig(64, 1024), batch_wait=batch_wait)
        await service.start()
        try:
            await body(service, *in_process_calls(service))
        finally:
            await service.stop()

    asyncio.run(main())
    return engine


def test_an_answer_and_a_health_check() -> None:
    async def body(service: Any, embed: Any, check: Any) -> None:
        assert rows_of(await embed(req([7, 8]), timeout=5))[0, :2].tolist() == [7, 2]
        assert (await check(None, timeout=1)).status == 1  # SERVING

    with_calls(body)


def test_a_bad_request_is_the_rpc_error_of_its_code() -> None:
    async def body(service: Any, embed: Any, check: Any) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await embed(req([5000]), timeout=5)
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    with_calls(body)


def test_a_request_still_queued_at_its_deadline_is_dropped_as_deadline_exceeded() -> None:
    async def body(service: Any, embed: Any, check: Any) -> None:
        await asyncio.gather(embed(req([1]), timeout=5), embed(req([2]), timeout=5))
        # one of the last batch's two clients back alone: it waits (5 s) for the other
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await embed(req([3]), timeout=0.1)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # dropped: its tokens leave the queue's budget, and the engine never runs it
        assert service.scheduler.num_queued_tokens == 0
        assert rows_of(await embed(req([4]), timeout=5))[0, 0] == 4

    assert with_calls(body, batch_wait=5.0).batches == [[1, 2], [4]]
