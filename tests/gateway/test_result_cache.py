"""The result cache (`--cache-size`): its bound and eviction order, answers equal to uncached
ones, one tenant's entries never another's, cleared when a replica turns healthy, off by
default."""

from __future__ import annotations

import asyncio
import contextvars
import tracemalloc
from typing import Any

import numpy as np
import pytest

from embedserve.contract import EmbedResponse
from embedserve.core.inputs import Head, InputOptions, InputPreparer
from embedserve.gateway.main import GatewayConfig
from embedserve.gateway.metrics import Metrics
from embedserve.gateway.pipeline import Pipeline, PipelineLimits
from embedserve.gateway.replicas import ReplicaPool
from embedserve.gateway.requests import EmbedJob
from embedserve.gateway.result_cache import (
    ENTRY_OVERHEAD,
    ResultCache,
    entry_bytes,
    set_tenant,
)

HEAD = Head(4, False, "float32")
ROW_BYTES = 4 * 4
KEY_BYTES = 4 * 2  # two int32 ids, no tenant
ENTRY = ROW_BYTES + KEY_BYTES + ENTRY_OVERHEAD


def rows(*values: float) -> np.ndarray:
    return np.array([[v] * 4 for v in values], dtype=np.float32)


def put(cache: ResultCache, *ids: int) -> None:
    cache.put_many(cache.keys([[i, 0] for i in ids], HEAD), rows(*ids))


def held(cache: ResultCache, *ids: int) -> list[bool]:
    return [r is not None for r in cache.get_many(cache.keys([[i, 0] for i in ids], HEAD))]


def in_context(work: Any) -> Any:
    """`work()` in a context of its own (the tenant set inside stays there)."""
    return contextvars.copy_context().run(work)


def test_the_bound_holds_and_the_least_recently_used_go_first() -> None:
    cache = ResultCache(3 * ENTRY)
    put(cache, 1, 2, 3)
    assert len(cache) == 3 and cache.nbytes == 3 * ENTRY
    assert held(cache, 1) == [True]  # 1 is now the most recently used: 2 goes next
    put(cache, 4)
    assert cache.nbytes == 3 * ENTRY <= cache.max_bytes
    assert held(cache, 1, 2, 3, 4) == [True, False, True, True]
    put(cache, 5, 6)  # 3 and 4 were used after 1 just now (the lookup above): 1 then 3 go
    assert held(cache, 1, 3, 4, 5, 6) == [False, False, True, True, True]


def test_an_entry_larger_than_the_bound_is_not_kept() -> None:
    cache = ResultCache(ENTRY - 1)
    put(cache, 1)
    assert len(cache) == 0 and cache.nbytes == 0
    cache = ResultCache(ENTRY)
    put(cache, 1)
    put(cache, 1)  # the same key again replaces it, counted once
    assert len(cache) == 1
    assert cache.nbytes == ENTRY == entry_bytes(cache.keys([[1, 0]], HEAD)[0], rows(1)[0])


def test_a_kept_row_is_a_copy_not_a_view_of_the_response() -> None:
    cache = ResultCache(10 * ENTRY)
    answer = rows(1, 2)
    cache.put_many(cache.keys([[1, 0], [2, 0]], HEAD), answer)
    kept = cache.get_many(cache.keys([[1, 0]], HEAD))[0]
    assert kept is not None and kept.base is None  # its own 16 bytes, not the response's
    answer[:] = 0
    assert kept.tolist() == [1.0] * 4


def test_the_per_entry_overhead_covers_what_python_spends() -> None:
    cache = ResultCache(1 << 40)
    seqs = [[101, 2000 + i, 3000 + i, 102] for i in range(2000)]
    answer = np.random.default_rng(0).random((2000, 384), dtype=np.float32)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2000):  # each entry holding its own request's Head, the worst case
            cache.put_many(cache.keys([seqs[i]], Head(384, True, "float32")), answer[i : i + 1])
        spent = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert spent <= cache.nbytes  # the bound counts at least what the entries cost


def test_tenants_do_not_share_entries() -> None:
    cache = ResultCache(10 * ENTRY)

    def as_tenant(key: bytes, work: Any) -> Any:
        def run() -> Any:
            set_tenant(key)
            return work()

        return in_context(run)

    as_tenant(b"key-a", lambda: put(cache, 1))
    assert as_tenant(b"key-a", lambda: held(cache, 1)) == [True]
    assert as_tenant(b"key-b", lambda: held(cache, 1)) == [False]
    assert in_context(lambda: held(cache, 1)) == [False]  # no key: a tenant of its own
    # the key itself is never kept, only its digest
    assert all(b"key-a" not in k[0] for k in cache._rows)


class Replicas:
    """Row i = [first id of sequence i] * 4, computed per call; counts the sequences sent."""

    def __init__(self) -> None:
        self.sequences = 0

    async def embed(self, request: Any, num_tokens: int) -> Any:
        ids = np.frombuffer(request.input_ids, dtype="<i4")
        starts = np.cumsum([0, *request.seqlens[:-1]])
        self.sequences += len(starts)
        out = np.repeat(ids[starts].astype(np.float32)[:, None] / 7, 4, axis=1)
        return EmbedResponse(embeddings=out.tobytes(), shape=list(out.shape), dtype="float32")


def pipeline_with(inputs: InputPreparer, cache: ResultCache | None) -> tuple[Pipeline, Replicas]:
    replicas = Replicas()
    limits = PipelineLimits(max_tokens_per_request=10_000, part_tokens=64)
    return Pipeline(inputs, replicas, limits, cache=cache), replicas  # type: ignore[arg-type]


def embed(pipeline: Pipeline, texts: list[str], head: Head = HEAD) -> np.ndarray:
    return asyncio.run(pipeline.embed(EmbedJob(texts, InputOptions(), head, "float")))[0]


def test_a_hit_answers_exactly_what_the_servers_did(inputs: InputPreparer) -> None:
    cache = ResultCache(1 << 20)
    pipeline, replicas = pipeline_with(inputs, cache)
    uncached, _ = pipeline_with(inputs, None)
    first = embed(pipeline, ["a query", "another", "a query"])
    assert replicas.sequences == 2 and len(cache) == 2  # the duplicate once, both kept
    again = embed(pipeline, ["another", "new one", "a query"])
    assert replicas.sequences == 3  # only "new one" went to the servers
    assert again.tobytes() == embed(uncached, ["another", "new one", "a query"]).tobytes()
    assert again[0].tobytes() == first[1].tobytes() and again[2].tobytes() == first[0].tobytes()
    # another head (dimensions, dtype, normalize) is another key
    embed(pipeline, ["a query"], Head(4, True, "float32"))
    assert replicas.sequences == 4


def test_off_by_default_nothing_is_kept_or_looked_up(inputs: InputPreparer) -> None:
    pipeline, replicas = pipeline_with(inputs, None)
    assert not pipeline.cache.enabled
    embed(pipeline, ["a query"])
    embed(pipeline, ["a query"])
    assert replicas.sequences == 2 and len(pipeline.cache) == 0
    assert GatewayConfig(replicas=("a:1",)).cache_size == 0


@pytest.mark.parametrize("command", [["gateway", "--replica", "127.0.0.1:1"], ["serve"]])
def test_a_negative_cache_size_is_refused(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from embedserve.cli.main import main

    assert main([*command, "--cache-size", "-1"]) == 2  # before any process starts
    assert "error: cache_size must be >= 0, got -1" in capsys.readouterr().err


def test_each_worker_holds_its_share(inputs: InputPreparer) -> None:
    from embedserve.gateway import main

    config = GatewayConfig(replicas=("127.0.0.1:1",), workers=4, cache_size=64_000_000)
    entry = config.entries[0]
    pipeline = main.make_pipeline(config, entry, None, inputs, None)
    assert pipeline.cache.max_bytes == 16_000_000


def test_a_replica_turning_healthy_or_added_clears_the_cache(tmp_path: Any) -> None:
    listed = tmp_path / "replicas.txt"
    listed.write_text("")
    cache = ResultCache(10 * ENTRY)
    pool = ReplicaPool(["127.0.0.1:9", f"file:{listed}"], on_change=cache.clear)
    replica = pool.replicas[0]
    answers = ["SERVING"]

    async def check(request: Any, timeout: float) -> Any:
        from grpc_health.v1 import health_pb2

        return health_pb2.HealthCheckResponse(
            status=getattr(health_pb2.HealthCheckResponse, answers[0])
        )

    replica.check = check

    async def main() -> None:
        put(cache, 1)
        replica.healthy = True
        await pool.poll_once()  # healthy and still healthy: kept
        assert len(cache) == 1
        answers[0] = "NOT_SERVING"
        await pool.poll_once()  # down: kept (nothing answers from a changed model yet)
        assert len(cache) == 1
        answers[0] = "SERVING"
        await pool.poll_once()  # back: it may be another model now
        assert len(cache) == 0
        put(cache, 2)
        listed.write_text("127.0.0.1:2\n")
        await pool.resolve_once()  # a replica added
        assert len(cache) == 0
        await pool.close()

    asyncio.run(main())


def test_metrics_count_hits_misses_bytes_entries_and_evictions() -> None:
    metrics = Metrics(model_label=True)
    assert b"cache" not in metrics.export_models({})  # no cache: no series
    cache = ResultCache(2 * ENTRY, metrics.cache("m"))
    put(cache, 1, 2, 3)
    held(cache, 1, 2, 3)
    text = metrics.export_models({}).decode()
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("embedserve_gateway_cache")
    }
    assert values['embedserve_gateway_cache_hits_total{model="m"}'] == 2
    assert values['embedserve_gateway_cache_misses_total{model="m"}'] == 1
    assert values['embedserve_gateway_cache_evictions_total{model="m"}'] == 1
    assert values['embedserve_gateway_cache_entries{model="m"}'] == 2
    assert values['embedserve_gateway_cache_bytes{model="m"}'] == 2 * ENTRY
