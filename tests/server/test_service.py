"""The gRPC service in process, in front of a fake engine whose behaviour each test controls;
the tests marked with `TRANSPORTS` also through the local socket (`server.local`)."""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from embedserve.contract import EmbedRequest, embed_handler, embed_stub
from embedserve.contract.local import LocalEmbedClient
from embedserve.engine.batch import PackedBatch
from embedserve.engine.seam import EngineSeam
from embedserve.server.local import serve_local
from embedserve.server.scheduler import SchedulerConfig
from embedserve.server.service import EmbedService

HIDDEN = 8
VOCAB = 1000
FAIL_ID = 666  # a batch containing this id makes the fake engine crash
TRANSPORTS = pytest.mark.parametrize("transport", ["grpc", "local"])


class Handle:
    def __init__(self, rows: np.ndarray, done: threading.Event | None = None) -> None:
        self.rows = rows
        self.done = done

    def ready(self) -> bool:
        return self.done is None or self.done.is_set()

    def wait(self) -> np.ndarray:
        if self.done is not None:
            assert self.done.wait(10)
        return self.rows


class FakeEngine:
    """Row i of a batch = [first id of sequence i, its length, 1, 1, ...]: easy to check."""

    output_width = HIDDEN

    def __init__(self) -> None:
        self.batches: list[list[int]] = []  # first ids of the sequences of each batch
        self.gate: threading.Event | None = None  # step() blocks on it while set
        self.lazy: list[threading.Event] = []  # results not ready until the test sets these
        self.threads: list[str] = []  # the thread each batch ran on
        self.ran_on: list[threading.Thread] = []

    def check(self, batch: PackedBatch) -> None:
        if batch.input_ids.min() < 0 or batch.input_ids.max() >= VOCAB:
            raise ValueError(f"token ids must be in [0, {VOCAB})")

    def step(self, batch: PackedBatch) -> Handle:
        if self.gate is not None:
            assert self.gate.wait(10)
        firsts = batch.input_ids[batch.cu_seqlens[:-1]]
        self.batches.append(firsts.tolist())
        self.threads.append(threading.current_thread().name)
        self.ran_on.append(threading.current_thread())
        if FAIL_ID in batch.input_ids:
            raise RuntimeError("simulated device failure")
        rows = np.ones((batch.num_seqs, HIDDEN), dtype=np.float32)
        rows[:, 0] = firsts
        rows[:, 1] = batch.seqlens
        done = self.lazy.pop(0) if self.lazy else None
        return Handle(rows, done)


def req(*seqs: list[int], **options: Any) -> Any:
    ids = np.array([t for s in seqs for t in s], dtype="<i4")
    return EmbedRequest(input_ids=ids.tobytes(), seqlens=[len(s) for s in seqs], **options)


def rows_of(response: Any) -> np.ndarray:
    return np.frombuffer(response.embeddings, dtype=response.dtype).reshape(response.shape)


def seam(engine: Any, **fields: Any) -> EngineSeam:
    """The fake's record as the service reads an engine's (`Engine.seam`), with `fields` (its
    output rules, span pooler, outputs encoder and outputs). Its step is looked up at each call:
    a test may replace the fake's while serving."""
    return EngineSeam(lambda b: engine.step(b), engine.check, engine.output_width, 64, **fields)


def with_server(
    engine: FakeEngine,
    body: Callable[[Any, EmbedService], Awaitable[None]],
    config: SchedulerConfig | None = None,
    batch_wait: float = 0.0,
    multivector_limit: Any = None,
    transport: str = "grpc",
    **seam_fields: Any,
) -> None:
    """`body(stub, service)` against the service, called over gRPC or its local socket."""

    async def main() -> None:
        service = EmbedService(
            seam(engine, **seam_fields),
            config or SchedulerConfig(64, 1024),
            batch_wait=batch_wait,
            multivector_limit=multivector_limit,
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((embed_handler(service.embed),))
        port = server.add_insecure_port("127.0.0.1:0")
        await service.start()
        await server.start()
        try:
            if transport == "local":
                with tempfile.TemporaryDirectory() as folder:
                    path = Path(folder) / "s.sock"
                    local = await serve_local(path, service.answer)
                    client = LocalEmbedClient(path)
                    try:
                        await asyncio.wait_for(body(client, service), 30)
                    finally:
                        await client.close()
                        await local.stop(0)
            else:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    await asyncio.wait_for(body(embed_stub(channel), service), 30)
        finally:
            await server.stop(0)
            await service.stop()

    asyncio.run(main())


@TRANSPORTS
def test_requests_are_batched_together_and_answered_in_order(transport: str) -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        engine.gate = threading.Event()  # hold the first batch so the others queue up
        calls = [stub(req([i, 5, 6], [i + 1]), timeout=10) for i in range(10, 50, 2)]
        tasks = [asyncio.ensure_future(c) for c in calls]
        await asyncio.sleep(0.3)
        engine.gate.set()
        for i, response in zip(range(10, 50, 2), await asyncio.gather(*tasks), strict=True):
            rows = rows_of(response)
            assert rows.shape == (2, HIDDEN) and response.dtype == "float32"
            assert rows[:, 0].tolist() == [i, i + 1]
            assert rows[:, 1].tolist() == [3, 1]
        # 20 requests of 4 tokens under a 64-token budget: whole requests, at most 16 per batch
        assert len(engine.batches) < 20
        assert all(len(b) <= 32 for b in engine.batches)

    with_server(engine, body, transport=transport)


def test_the_head_is_applied_per_request() -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        plain, short, quantized = await asyncio.gather(
            stub(req([3, 4]), timeout=10),
            stub(req([3, 4], dimensions=2, normalize=True), timeout=10),
            stub(req([3, 4], normalize=True, output_dtype="int8"), timeout=10),
        )
        np.testing.assert_array_equal(rows_of(plain)[0, :3], [3, 2, 1])
        np.testing.assert_allclose(rows_of(short)[0], np.array([3, 2]) / np.sqrt(13), rtol=1e-6)
        q = rows_of(quantized)
        assert q.dtype == np.int8 and q.shape == (1, HIDDEN)
        assert q[0, 0] == round(127 * 3 / np.sqrt(3**2 + 2**2 + 6))

    with_server(engine, body)


@pytest.mark.parametrize(
    "request_, message",
    [
        (req([1, 2, 9999]), "token ids must be in"),
        (EmbedRequest(input_ids=b"\x01\x00\x00", seqlens=[1]), "whole number"),
        (EmbedRequest(input_ids=b"", seqlens=[]), "at least one sequence"),
        (EmbedRequest(input_ids=b"\x01\0\0\0", seqlens=[2]), "sum"),
        (req([1, 2], dimensions=HIDDEN + 1), "dimensions"),
        (req([1, 2], output_dtype="int4"), "output_dtype"),
        (req([1, 2], dimensions=3, output_dtype="binary"), "multiple of 8"),
    ],
)
@TRANSPORTS
def test_bad_requests_are_invalid_argument_and_never_reach_the_engine(
    request_: Any, message: str, transport: str
) -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(request_, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in e.value.details()
        assert engine.batches == []
        assert rows_of(await stub(req([7]), timeout=10))[0, 0] == 7

    with_server(engine, body, transport=transport)


async def _fails_on_the_device(stub: Any) -> None:
    """A request holding FAIL_ID fails as the fake engine's step does: INTERNAL, its message."""
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub(req([FAIL_ID, 1]), timeout=10)
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert "simulated device failure" in e.value.details()


@TRANSPORTS
def test_an_engine_failure_fails_only_its_batch(transport: str) -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        await _fails_on_the_device(stub)
        responses = await asyncio.gather(*(stub(req([i]), timeout=10) for i in range(1, 6)))
        assert [rows_of(r)[0, 0] for r in responses] == [1, 2, 3, 4, 5]

    with_server(engine, body, transport=transport)


@TRANSPORTS
def test_backpressure_is_resource_exhausted(transport: str) -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        engine.gate = threading.Event()
        first = asyncio.ensure_future(stub(req([1] * 50), timeout=10))  # taken by the engine
        await asyncio.sleep(0.2)
        queued = [asyncio.ensure_future(stub(req([2] * 50), timeout=10)) for _ in range(2)]
        await asyncio.sleep(0.2)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(req([3] * 50), timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        engine.gate.set()
        for response in await asyncio.gather(first, *queued):
            assert rows_of(response).shape == (1, HIDDEN)

    with_server(
        engine,
        body,
        SchedulerConfig(max_batch_tokens=64, max_queued_tokens=100),
        transport=transport,
    )


@TRANSPORTS
def test_requests_whose_client_went_away_are_dropped(transport: str) -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        engine.gate = threading.Event()
        busy = asyncio.ensure_future(stub(req([1] * 60), timeout=10))
        await asyncio.sleep(0.2)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(req([500]), timeout=0.3)  # gives up while the engine is busy
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.sleep(0.2)
        engine.gate.set()
        await busy
        assert rows_of(await stub(req([7]), timeout=10))[0, 0] == 7
        assert [500] not in engine.batches and all(500 not in b for b in engine.batches)
        assert service.scheduler.num_dropped == 1

    with_server(engine, body, transport=transport)


def test_batch_n_plus_1_launches_while_batch_n_is_in_flight() -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        first_done = threading.Event()
        engine.lazy = [first_done]  # batch 1's result is not ready until we say so
        first = asyncio.ensure_future(stub(req([1]), timeout=10))
        await asyncio.sleep(0.2)
        second = await stub(req([2]), timeout=10)  # launched and answered meanwhile
        assert rows_of(second)[0, 0] == 2
        assert not first.done()
        first_done.set()
        assert rows_of(await first)[0, 0] == 1
        assert engine.batches == [[1], [2]]

    with_server(engine, body)


def test_a_result_that_fails_while_waited_for_fails_only_its_batch() -> None:
    engine = FakeEngine()

    class Broken:
        def ready(self) -> bool:
            return False

        def wait(self) -> np.ndarray:
            raise RuntimeError("simulated failure of the device copy")

    async def body(stub: Any, service: EmbedService) -> None:
        step = engine.step
        engine.step = lambda batch: Broken() if 13 in batch.input_ids else step(batch)  # type: ignore[method-assign]
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(req([13]), timeout=10)
        assert e.value.code() == grpc.StatusCode.INTERNAL
        assert "simulated failure of the device copy" in (e.value.details() or "")
        assert rows_of(await stub(req([7]), timeout=10))[0, 0] == 7  # still serving
        lazy = threading.Event()
        engine.lazy = [lazy]  # answered through the result thread
        later = asyncio.ensure_future(stub(req([8]), timeout=10))
        await asyncio.sleep(0.1)
        lazy.set()
        assert rows_of(await later)[0, 0] == 8

    with_server(engine, body)


def test_batch_wait_gathers_the_clients_of_the_last_batch() -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        engine.gate = threading.Event()
        first = asyncio.ensure_future(stub(req([1]), timeout=10))
        await asyncio.sleep(0.2)  # [1] is on the engine; 2 and 3 wait behind it
        queued = [asyncio.ensure_future(stub(req([i]), timeout=10)) for i in (2, 3)]
        await asyncio.sleep(0.2)
        engine.gate.set()
        await first
        again = await stub(req([4]), timeout=10)  # the first client comes back
        await asyncio.gather(*queued)
        assert rows_of(again)[0, 0] == 4
        # without the wait, [2, 3] would have run as soon as [1] was done, then [4] alone
        assert engine.batches == [[1], [2, 3, 4]]

    with_server(engine, body, batch_wait=2.0)


def test_batch_wait_never_delays_a_lone_client() -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        loop = asyncio.get_running_loop()
        for i in range(1, 6):
            start = loop.time()
            assert rows_of(await stub(req([i]), timeout=10))[0, 0] == i
            assert loop.time() - start < 1.0  # far below the 2 s wait
        assert engine.batches == [[i] for i in range(1, 6)]

    with_server(engine, body, batch_wait=2.0)


async def behind_a_gated_first(stub: Any, engine: FakeEngine, ids: list[int]) -> float:
    """[1] on the engine behind a closed gate, one request per id queued behind it, then the
    gate opened; once all are answered, the loop time at which it opened."""
    engine.gate = threading.Event()
    first = asyncio.ensure_future(stub(req([1]), timeout=10))
    await asyncio.sleep(0.2)
    queued = [asyncio.ensure_future(stub(req([i]), timeout=10)) for i in ids]
    await asyncio.sleep(0.2)
    opened = asyncio.get_running_loop().time()
    engine.gate.set()
    await asyncio.gather(first, *queued)
    return opened


def test_batch_wait_ends_once_enough_requests_are_queued() -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        start = await behind_a_gated_first(stub, engine, [2, 3, 4, 5])
        assert asyncio.get_running_loop().time() - start < 1.0  # four waited: no 2 s wait
        await stub(req([6]), timeout=10)
        assert engine.batches == [[1], [2, 3, 4, 5], [6]]

    with_server(engine, body, batch_wait=2.0)


def test_batch_wait_doubles_when_more_clients_are_expected_than_the_cap() -> None:
    """After a batch of five (more than BATCH_WAIT_MAX_REQUESTS), a lone returning client waits
    up to twice the batch wait for the others (they are coming)."""
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        loop = asyncio.get_running_loop()
        await behind_a_gated_first(stub, engine, [2, 3, 4, 5, 6])
        start = loop.time()
        await stub(req([7]), timeout=10)  # one of the five comes back alone
        waited = loop.time() - start
        assert engine.batches == [[1], [2, 3, 4, 5, 6], [7]]
        assert 0.45 <= waited < 2.0  # about 2 x 0.3 s after the engine took [2..6]; not 0.3

    with_server(engine, body, batch_wait=0.3)


def test_pplx_output_rules_and_their_dimensions_floor() -> None:
    from embedserve.core.head import encode_pplx
    from embedserve.server.service import parse_request

    # the floor: 128 ... hidden under pplx rules, 1 ... hidden otherwise
    for bad in (1, 64, 127, 1025):
        with pytest.raises(ValueError, match="between 128 and 1024"):
            parse_request(req([1, 2], dimensions=bad), 1024, "pplx")
    assert parse_request(req([1, 2], dimensions=128), 1024, "pplx")[1].dimensions == 128
    assert parse_request(req([1, 2], dimensions=64), 1024)[1].dimensions == 64

    engine = FakeEngine()
    pooled = np.ones((1, HIDDEN), dtype=np.float32)
    pooled[0, :2] = [3, 2]  # the fake engine's row for ids [3, 4]

    async def body(stub: Any, service: EmbedService) -> None:
        int8, binary, floats = await asyncio.gather(
            stub(req([3, 4], normalize=True, output_dtype="int8"), timeout=10),
            stub(req([3, 4], output_dtype="binary"), timeout=10),
            stub(req([3, 4], dimensions=HIDDEN, normalize=True), timeout=10),
        )
        # int8 = round(127 tanh(x)) of the un-normalized vector, whatever `normalize` says
        assert rows_of(int8).tobytes() == encode_pplx(pooled, "int8").tobytes()
        assert rows_of(int8)[0, :3].tolist() == [126, 122, 97]  # 127 tanh(3), (2), (1)
        # binary: sign bits, least significant bit first (all positive here)
        assert rows_of(binary).dtype == np.uint8 and rows_of(binary).tolist() == [[255]]
        np.testing.assert_allclose(rows_of(floats)[0], pooled[0] / np.linalg.norm(pooled[0]))

    with_server(engine, body, output_rules="pplx")


class FakeSpanPooler:
    """Row k = [first id of span k, last id of span k, its length, 1, ...]; records its batches."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.calls: list[tuple[int, int]] = []  # (num_seqs, num_spans) per call

    def __call__(self, batch: PackedBatch, spans: np.ndarray) -> np.ndarray:
        if self.engine.gate is not None:
            assert self.engine.gate.wait(10)
        self.calls.append((batch.num_seqs, spans.shape[0]))
        rows = np.ones((spans.shape[0], HIDDEN), dtype=np.float32)
        rows[:, 0] = batch.input_ids[spans[:, 0]]
        rows[:, 1] = batch.input_ids[spans[:, 1] - 1]
        rows[:, 2] = spans[:, 1] - spans[:, 0]
        return rows


def test_span_requests_pool_each_span_and_are_batched_apart_from_plain_ones() -> None:
    engine = FakeEngine()
    pooler = FakeSpanPooler(engine)

    async def body(stub: Any, service: EmbedService) -> None:
        engine.gate = threading.Event()  # hold the first batch so the others queue up
        first = asyncio.ensure_future(stub(req([1]), timeout=10))
        await asyncio.sleep(0.2)
        calls = [
            stub(req([10, 11, 12], [13, 14], span_bounds=[0, 2, 1, 3, 3, 5]), timeout=10),
            stub(req([20, 21, 22, 23], span_bounds=[1, 4, 0, 1]), timeout=10),
            stub(req([30, 31]), timeout=10),
            stub(req([40, 41, 42], span_bounds=[2, 3]), timeout=10),
        ]
        tasks = [asyncio.ensure_future(c) for c in calls]
        await asyncio.sleep(0.3)
        engine.gate.set()
        await first
        a, b, plain, c = (rows_of(r) for r in await asyncio.gather(*tasks))
        assert a[:, :3].tolist() == [[10, 11, 2], [11, 12, 2], [13, 14, 2]]
        assert b[:, :3].tolist() == [[21, 23, 3], [20, 20, 1]]
        assert plain[:, :2].tolist() == [[30, 2]]
        assert c[:, :3].tolist() == [[42, 42, 1]]
        # FCFS: the two span requests before the plain one run as one batch, the last alone
        assert pooler.calls == [(3, 5), (1, 1)]
        assert engine.batches == [[1], [30]]

    with_server(engine, body, span_pooler=pooler)


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        ([0, 1, 2], "pairs"),
        ([1, 1], "non-empty"),
        ([2, 1], "non-empty"),
        ([0, 6], "within [0, 5)"),
        ([2, 4], "cross a sequence boundary"),
    ],
)
def test_bad_spans_are_invalid_argument(bounds: list[int], message: str) -> None:
    engine = FakeEngine()
    pooler = FakeSpanPooler(engine)

    async def body(stub: Any, service: EmbedService) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(req([1, 2, 3], [4, 5], span_bounds=bounds), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in e.value.details()
        assert pooler.calls == [] and engine.batches == []

    with_server(engine, body, span_pooler=pooler)


def test_span_requests_are_refused_without_a_span_pooler() -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(req([1, 2], span_bounds=[0, 2]), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not pool spans" in e.value.details()

    with_server(engine, body)


def test_each_stage_of_the_request_path_is_timed() -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        await asyncio.gather(*(stub(req([i]), timeout=10) for i in range(1, 4)))
        lazy = threading.Event()
        engine.lazy = [lazy]  # one batch answered through the results thread
        later = asyncio.ensure_future(stub(req([9]), timeout=10))
        await asyncio.sleep(0.05)
        lazy.set()
        await later
        times = service.stage_times.snapshot()
        assert times["queue"][0][-1] == 4  # per request
        batches = service.num_batches
        for stage in ("launch", "device", "encode", "deliver"):  # per batch
            assert times[stage][0][-1] == batches, stage
        assert times["device"][1] >= 0.04  # the wait for the lazy result is the device's

    with_server(engine, body)


def test_an_idle_engine_thread_gives_freed_memory_back_after_much_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from embedserve.server import service as service_module

    trims: list[float] = []
    monkeypatch.setattr(service_module, "TRIM_AFTER_TOKENS", 20)
    monkeypatch.setattr(service_module, "release_free_memory", lambda: trims.append(1.0))
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        await stub(req([1, 2, 3]), timeout=10)  # 3 tokens: not yet
        await asyncio.sleep(0.1)
        assert trims == []
        for _ in range(8):  # 24 tokens in all, then idle
            await stub(req([1, 2, 3]), timeout=10)
        deadline = asyncio.get_running_loop().time() + 5
        while not trims and asyncio.get_running_loop().time() < deadline:
            await stub(req([4]), timeout=10)  # the loop comes round once more
            await asyncio.sleep(0.05)
        assert len(trims) == 1

    with_server(engine, body)


# -- the engine thread: built on, stepped on, woken once per loop turn (`server.engine_thread`) --


def test_every_batch_runs_on_the_thread_the_engine_was_built_on() -> None:
    from embedserve.server.engine_thread import EngineThread

    engine_thread = EngineThread()
    built_on = engine_thread.submit(lambda: threading.current_thread()).result(timeout=10)
    engine = FakeEngine()

    async def main() -> None:
        service = EmbedService(seam(engine), SchedulerConfig(64, 1024))
        await service.start(engine_thread)
        try:
            for i in (3, 4):
                assert rows_of(await service.answer(req([i])))[0, 0] == i
            big = await service.answer(req([7] * 9))
            assert rows_of(big)[0, :2].tolist() == [7, 9]
        finally:
            await service.stop()

    asyncio.run(main())
    assert engine.ran_on == [built_on] * 3
    assert built_on is not threading.main_thread() and built_on.name == "engine"


def test_a_service_s_own_engine_thread_ends_with_it() -> None:
    def engine_threads() -> int:
        return sum(t.name == "engine" and t.is_alive() for t in threading.enumerate())

    before = engine_threads()

    async def body(stub: Any, service: EmbedService) -> None:
        assert rows_of(await stub(req([3]), timeout=10))[0, 0] == 3
        assert engine_threads() == before + 1

    with_server(FakeEngine(), body)
    deadline = time.monotonic() + 5
    while engine_threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine_threads() == before


def test_a_request_that_finds_the_engine_busy_queues_behind_it() -> None:
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        engine.gate = threading.Event()  # the first batch holds the engine thread
        first = asyncio.ensure_future(stub(req([1] * 9), timeout=10))
        await asyncio.sleep(0.2)
        queued = [asyncio.ensure_future(stub(req([i]), timeout=10)) for i in (2, 3)]
        await asyncio.sleep(0.2)
        assert not any(q.done() for q in queued)  # waiting behind the engine
        engine.gate.set()
        answers = await asyncio.gather(first, *queued)
        assert [rows_of(a)[0, 0] for a in answers] == [1, 2, 3]
        assert engine.batches == [[1], [2, 3]] and set(engine.threads) == {"engine"}

    with_server(engine, body)


def test_requests_that_arrive_together_are_one_batch() -> None:
    """Requests read from one socket buffer start as tasks in one turn of the loop: the engine
    thread is woken once they have all queued, so it batches them (woken by the first, it took
    that one alone; 16 clients on 2 cores were served one forward each)."""
    engine = FakeEngine()

    async def body(stub: Any, service: EmbedService) -> None:
        wakes = []
        wake = service._wake_engine
        service._wake_engine = lambda: (wakes.append(len(service.scheduler)), wake())  # type: ignore[method-assign]
        for _ in range(3):
            engine.batches.clear()
            answers = await asyncio.gather(*(service.answer(req([i])) for i in (2, 3, 4, 5)))
            assert [rows_of(a)[0, 0] for a in answers] == [2, 3, 4, 5]
            assert engine.batches == [[2, 3, 4, 5]]
        assert wakes == [4, 4, 4]  # one wake per turn, once all four had queued
        assert rows_of(await stub(req([6]), timeout=10))[0, 0] == 6  # alone: at once
        assert set(engine.threads) == {"engine"}

    with_server(engine, body)
