"""An engine that can no longer serve is found (`server.guard`), and a cancelled request gives
its tokens back to the queue budget at once; the service in process, in front of fake engines."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
import pytest

from embedserve.server.guard import EngineGuard, unrecoverable
from embedserve.server.scheduler import SchedulerConfig
from embedserve.server.service import EmbedService, RequestFailed
from tests.server.faults import FailingEngine, fault_env, inject_faults, wrap_build_engine
from tests.server.test_service import FAIL_ID, FakeEngine, req, rows_of, seam


class Tripped:
    """The guard's `on_fatal`: the reasons, and when the first came."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.at: float | None = None
        self.event = threading.Event()

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self.at = self.at or time.monotonic()
        self.event.set()


def run_service(
    engine: Any,
    body: Callable[[EmbedService], Awaitable[None]],
    guard: EngineGuard | None = None,
    config: SchedulerConfig | None = None,
) -> None:
    async def main() -> None:
        service = EmbedService(seam(engine), config or SchedulerConfig(64, 1024), guard=guard)
        await service.start()
        if guard is not None:
            guard.start()
        try:
            await asyncio.wait_for(body(service), 30)
        finally:
            if engine.gate is not None:
                engine.gate.set()
            await service.stop()
            if guard is not None:
                guard.stop()

    asyncio.run(main())


async def failure_code(call: Awaitable[Any]) -> grpc.StatusCode:
    with pytest.raises(RequestFailed) as e:
        await call
    return e.value.code


def test_consecutive_failed_steps_trip_the_guard_once_and_a_success_resets_the_count() -> None:
    engine, tripped = FakeEngine(), Tripped()
    guard = EngineGuard(tripped, max_failures=3, step_timeout=30)

    async def body(service: EmbedService) -> None:
        for _ in range(2):
            assert await failure_code(service.answer(req([FAIL_ID]))) == grpc.StatusCode.INTERNAL
        assert rows_of(await service.answer(req([7])))[0, 0] == 7  # resets the count
        # a client's bad input is not the engine's failure
        bad = service.answer(req([5000]))
        assert await failure_code(bad) == grpc.StatusCode.INVALID_ARGUMENT
        for _ in range(2):
            await failure_code(service.answer(req([FAIL_ID])))
        assert tripped.reasons == []
        await failure_code(service.answer(req([FAIL_ID])))
        assert tripped.event.wait(2)
        for _ in range(2):
            await failure_code(service.answer(req([FAIL_ID])))
        assert tripped.reasons == ["3 engine steps failed in a row (last: RuntimeError)"]

    run_service(engine, body, guard)


def test_one_cuda_error_trips_the_guard_at_once() -> None:
    class CudaBroken(FakeEngine):
        def step(self, batch: Any) -> Any:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    engine, tripped = CudaBroken(), Tripped()
    guard = EngineGuard(tripped, max_failures=100, step_timeout=30)

    async def body(service: EmbedService) -> None:
        assert await failure_code(service.answer(req([1]))) == grpc.StatusCode.INTERNAL
        assert tripped.event.wait(2)
        assert tripped.reasons[0].startswith("unrecoverable engine error: RuntimeError: CUDA")

    run_service(engine, body, guard)


def test_which_errors_are_unrecoverable() -> None:
    assert unrecoverable(RuntimeError("CUDA error: device-side assert triggered"))
    assert unrecoverable(RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemm"))
    assert not unrecoverable(RuntimeError("CUDA error: out of memory"))
    assert not unrecoverable(MemoryError("CUDA out of memory. Tried to allocate 9.2 GiB"))
    assert not unrecoverable(RuntimeError("simulated device failure"))


def test_the_watchdog_trips_on_a_step_that_does_not_return_and_abandon_refuses_work() -> None:
    engine, tripped = FakeEngine(), Tripped()
    guard = EngineGuard(tripped, max_failures=3, step_timeout=0.4)

    async def body(service: EmbedService) -> None:
        engine.gate = threading.Event()  # the device hangs
        start = time.monotonic()
        stuck = asyncio.ensure_future(service.answer(req([1] * 60)))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(service.answer(req([2] * 10)))
        assert await asyncio.to_thread(tripped.event.wait, 3)
        assert tripped.at is not None and 0.4 <= tripped.at - start < 1.5
        assert "has not returned in" in tripped.reasons[0]
        service.abandon()  # what the server does next (`server.main._give_up`)
        assert await failure_code(queued) == grpc.StatusCode.UNAVAILABLE
        assert await failure_code(service.answer(req([3]))) == grpc.StatusCode.UNAVAILABLE
        assert not stuck.done()  # the hung step is not waited for
        stuck.cancel()

    run_service(engine, body, guard)


def test_no_watchdog_trip_while_steps_return_in_time() -> None:
    engine, tripped = FakeEngine(), Tripped()
    guard = EngineGuard(tripped, max_failures=3, step_timeout=0.3)

    async def body(service: EmbedService) -> None:
        for i in range(8):
            assert rows_of(await service.answer(req([10 + i])))[0, 0] == 10 + i
            await asyncio.sleep(0.1)
        assert tripped.reasons == []

    run_service(engine, body, guard)


def test_a_cancelled_request_gives_its_tokens_back_to_the_queue_budget_at_once() -> None:
    engine = FakeEngine()

    async def body(service: EmbedService) -> None:
        engine.gate = threading.Event()
        busy = asyncio.ensure_future(service.answer(req([1] * 50)))  # taken by the engine
        await asyncio.sleep(0.2)
        gone = asyncio.ensure_future(service.answer(req([2] * 60)))  # queued...
        await asyncio.sleep(0.05)
        gone.cancel()  # ...and its client goes away (a deadline) before the engine frees up
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert service.scheduler.num_queued_tokens == 0
        # 60 live tokens fit under the 100-token budget: not refused for the cancelled 60
        after = asyncio.ensure_future(service.answer(req([3] * 60)))
        await asyncio.sleep(0.05)
        assert service.scheduler.num_queued_tokens == 60
        engine.gate.set()
        assert rows_of(await after)[0, 0] == 3
        await busy
        assert service.scheduler.num_queued_tokens == 0  # the dropped one is not counted twice
        assert service.scheduler.num_dropped == 1

    run_service(engine, body, config=SchedulerConfig(max_batch_tokens=64, max_queued_tokens=100))


def test_the_fault_hook_fails_every_step_of_the_one_process_that_claims_its_file(
    tmp_path: Any,
) -> None:
    engine = FakeEngine()
    switch = tmp_path / "fail"
    assert inject_faults(engine, switch) is engine  # no file: nothing changes
    switch.touch()
    faulty = inject_faults(engine, switch)
    assert isinstance(faulty, FailingEngine) and not switch.exists()
    assert inject_faults(engine, switch) is engine  # claimed once: the replacement serves
    assert faulty.output_width == engine.output_width
    batch = np.array([1, 2], dtype=np.int64)
    with pytest.raises(RuntimeError, match="fault injection"):
        faulty.step(batch)


def test_the_fault_hook_wraps_the_servers_engine_builder(tmp_path: Any) -> None:
    """`wrap_build_engine` on a stand-in of `server.main`, then in a fresh process under
    `fault_env`: its `server.main._build_engine` is the wrapped one, and nothing is claimed
    before an engine is built. Without the environment the product's own is untouched."""
    switch = tmp_path / "fail"
    switch.touch()
    engine = FakeEngine()
    module = types.ModuleType("server_main")
    module._build_engine = lambda config: (engine, None)
    wrap_build_engine(module, switch)
    faulty, budget = module._build_engine(None)
    assert isinstance(faulty, FailingEngine) and budget is None and not switch.exists()
    assert module._build_engine(None) == (engine, None)

    switch.touch()
    probe = "import embedserve.server.main as m; print(m._build_engine.__qualname__)"
    for env, want in (
        (fault_env(switch), "wrap_build_engine.<locals>.build_faulty"),
        ({}, "_build_engine"),
    ):
        out = subprocess.run(
            [sys.executable, "-c", probe], env={**os.environ, **env},
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        assert out.stdout.strip() == want, out.stderr
    assert switch.exists()
