"""The service stepping its engine on the event loop's thread (`server.inline`, `serve
--one-process`), called in process as the gateway there calls it, in front of the fake engine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from embedserve.server.inline import InlineService
from embedserve.server.scheduler import SchedulerConfig
from embedserve.server.service import RequestFailed
from tests.server.test_service import FAIL_ID, FakeEngine, req, rows_of, seam


def run(
    engine: FakeEngine,
    body: Callable[[InlineService], Awaitable[None]],
    batch_wait: float = 0.0,
    config: SchedulerConfig | None = None,
) -> None:
    async def main() -> None:
        service = InlineService(
            seam(engine), config or SchedulerConfig(64, 1024), batch_wait=batch_wait
        )
        await service.start()
        try:
            await body(service)
        finally:
            await service.stop()

    asyncio.run(main())


def test_requests_of_one_turn_are_one_batch_run_on_the_loop_s_thread() -> None:
    engine = FakeEngine()

    async def body(service: InlineService) -> None:
        for _ in range(2):
            engine.batches.clear()
            answers = await asyncio.gather(*(service.answer(req([i])) for i in (2, 3, 4, 5)))
            assert [rows_of(a)[0, 0] for a in answers] == [2, 3, 4, 5]
            assert engine.batches == [[2, 3, 4, 5]]
        assert rows_of(await service.answer(req([6] * 3)))[0, :2].tolist() == [6, 3]

    run(engine, body)
    assert set(engine.ran_on) == {threading.main_thread()}  # asyncio.run's loop is here


def test_requests_that_arrive_during_a_step_are_the_next_batch() -> None:
    engine = FakeEngine()

    async def body(service: InlineService) -> None:
        step = engine.step
        late: list[asyncio.Future[Any]] = []

        def step_and_more_arrive(batch: Any) -> Any:  # as requests read while the loop steps
            if not late:
                late.extend(asyncio.ensure_future(service.answer(req([i]))) for i in (8, 9))
            return step(batch)

        engine.step = step_and_more_arrive  # type: ignore[method-assign]
        first = await service.answer(req([7]))
        answers = await asyncio.gather(*late)
        assert rows_of(first)[0, 0] == 7 and [rows_of(a)[0, 0] for a in answers] == [8, 9]
        assert engine.batches == [[7], [8, 9]]

    run(engine, body)


def test_batch_wait_gathers_the_clients_of_the_last_batch_without_blocking_the_loop() -> None:
    engine = FakeEngine()

    async def body(service: InlineService) -> None:
        await asyncio.gather(*(service.answer(req([i])) for i in (1, 2, 3)))
        loop = asyncio.get_running_loop()
        start = loop.time()
        ticks = 0

        async def tick() -> None:  # the loop keeps turning while the batch waits
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        back = [asyncio.ensure_future(service.answer(req([4])))]
        await asyncio.sleep(0.1)
        back += [asyncio.ensure_future(service.answer(req([i]))) for i in (5, 6)]
        await asyncio.gather(*back)
        ticker.cancel()
        # [4] waited for the two others of the last batch (1 s wait): one batch, well before it
        assert engine.batches == [[1, 2, 3], [4, 5, 6]]
        assert loop.time() - start < 0.9 and ticks >= 5

    run(engine, body, batch_wait=1.0)


def test_batch_wait_never_delays_a_lone_client_and_ends_at_its_deadline() -> None:
    engine = FakeEngine()

    async def body(service: InlineService) -> None:
        loop = asyncio.get_running_loop()
        for i in (1, 2, 3):
            start = loop.time()
            await service.answer(req([i]))
            assert loop.time() - start < 0.2  # far below the 0.5 s wait
        await asyncio.gather(*(service.answer(req([i])) for i in (4, 5)))
        start = loop.time()
        await service.answer(req([6]))  # one of two comes back alone: waits for the other
        assert 0.3 <= loop.time() - start < 2.0
        assert engine.batches == [[1], [2], [3], [4, 5], [6]]

    run(engine, body, batch_wait=0.5)


def test_a_batch_waits_for_the_requests_read_in_this_process_that_have_not_queued() -> None:
    """The gateway in the same process has read three requests; the first to queue waits, turn
    by turn, for the other two (as they are parsed and tokenized) rather than run alone."""
    engine = FakeEngine()
    held = [0]

    async def body(service: InlineService) -> None:
        service.in_process = lambda: held[0]
        await service.answer(req([1]))  # the engine's last step: the wait counts from it
        held[0] = 3
        loop = asyncio.get_running_loop()
        start = loop.time()
        first = asyncio.ensure_future(service.answer(req([2])))
        for _ in range(5):  # a few turns of the loop: the others still on their way
            await asyncio.sleep(0)
        assert not first.done()
        others = [asyncio.ensure_future(service.answer(req([i]))) for i in (3, 4)]
        await asyncio.gather(first, *others)
        held[0] = 0
        assert engine.batches == [[1], [2, 3, 4]] and loop.time() - start < 0.9

    run(engine, body, batch_wait=1.0)


def test_bad_requests_and_a_failing_batch_fail_only_themselves() -> None:
    engine = FakeEngine()

    async def body(service: InlineService) -> None:
        with pytest.raises(RequestFailed) as bad:
            await service.answer(req([5000]))
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT and "token ids" in str(bad.value)
        with pytest.raises(RequestFailed) as failed:
            await service.answer(req([FAIL_ID]))
        assert failed.value.code == grpc.StatusCode.INTERNAL
        assert "simulated device failure" in str(failed.value)
        assert rows_of(await service.answer(req([3])))[0, 0] == 3  # serving on

    run(engine, body)
    assert engine.batches == [[FAIL_ID], [3]]


def test_stop_fails_what_is_queued_as_unavailable() -> None:
    engine = FakeEngine()

    async def main() -> None:
        service = InlineService(seam(engine), SchedulerConfig(64, 1024), batch_wait=5.0)
        await service.start()
        await asyncio.gather(*(service.answer(req([i])) for i in (1, 2)))
        waiting = asyncio.ensure_future(service.answer(req([3])))  # waits for a second client
        await asyncio.sleep(0.1)
        await service.stop()
        with pytest.raises(RequestFailed) as stopped:
            await waiting
        assert stopped.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(RequestFailed):
            await service.answer(req([4]))

    asyncio.run(main())
    assert engine.batches == [[1, 2]]


def test_freed_memory_is_given_back_once_idle_after_much_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from embedserve.server import inline

    trims: list[int] = []
    monkeypatch.setattr(inline, "TRIM_AFTER_TOKENS", 20)
    monkeypatch.setattr(inline, "release_free_memory", lambda: trims.append(len(trims)))
    engine = FakeEngine()

    async def body(service: InlineService) -> None:
        await service.answer(req([1, 2, 3]))  # 3 tokens: not yet
        assert trims == []
        for _ in range(8):  # 27 tokens in all, each batch leaving the queue empty
            await service.answer(req([1, 2, 3]))
        assert trims == [0]  # once, when past 20 (and counted again from there)

    run(engine, body)


def test_a_gpu_engine_is_refused() -> None:
    async def main() -> None:
        service = InlineService(seam(FakeEngine(), device="cuda:0"), SchedulerConfig(64, 1024))
        with pytest.raises(ValueError, match="for the CPU"):
            await service.start()

    asyncio.run(main())


def test_a_request_that_never_queues_neither_holds_batches_nor_spins_the_loop() -> None:
    """Faults IV: a slow upload or /health in flight counted as on its way: every batch waited
    to the batch wait's deadline, the loop spinning with call_soon meanwhile."""
    from embedserve.server import inline

    engine = FakeEngine()
    looks = [0]

    async def body(service: InlineService) -> None:
        service.in_process = lambda: 3  # two that never queue, beside each request
        run_due = service._run_due

        def counted() -> None:
            looks[0] += 1
            run_due()

        service._run_due = counted  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        for i in (1, 2, 3):
            start = loop.time()
            await service.answer(req([i]))
            assert loop.time() - start < 0.2  # far below the 1 s wait
        assert engine.batches == [[1], [2], [3]]

    run(engine, body, batch_wait=1.0)
    assert looks[0] <= 3 * (inline.PATIENT_TURNS + 4)
