"""Replica choice (fewest outstanding tokens, healthy only) and the one retry, with fake stubs."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from embedserve.gateway import replicas
from embedserve.gateway.errors import ApiError
from embedserve.gateway.replicas import ReplicaPool


class RpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=code.name)


def pool_of(*behaviours: Any) -> tuple[ReplicaPool, list[list[int]]]:
    """Replicas whose `embed` either returns the replica index or raises the given code."""
    pool = ReplicaPool([f"host{i}:1" for i in range(len(behaviours))], timeout=1.0)
    seen: list[list[int]] = [[] for _ in behaviours]
    for i, (replica, behaviour) in enumerate(zip(pool.replicas, behaviours, strict=True)):
        replica.healthy = True

        async def embed(
            request: Any, timeout: float, i: int = i, behaviour: Any = behaviour
        ) -> Any:
            seen[i].append(request)
            if isinstance(behaviour, grpc.StatusCode):
                raise RpcError(behaviour)
            return i

        replica.embed = embed
    return pool, seen


def test_choose_prefers_fewest_outstanding_tokens_among_healthy() -> None:
    pool, _ = pool_of("ok", "ok", "ok")
    a, b, c = pool.replicas
    a.sent_tokens, b.sent_tokens, c.sent_tokens = 50, 10, 0
    c.healthy = False
    assert pool.choose() is b
    assert pool.choose(exclude=b) is a
    a.healthy = b.healthy = False
    assert pool.choose() is None


def test_a_failed_call_is_retried_once_on_another_replica() -> None:
    pool, seen = pool_of(grpc.StatusCode.UNAVAILABLE, "ok")
    pool.replicas[1].sent_tokens = 5  # so the first choice is the failing replica
    assert asyncio.run(pool.embed(1, 10)) == 1
    assert seen == [[1], [1]]
    assert not pool.replicas[0].healthy  # marked down until the next health check
    assert all(r.outstanding_tokens in (0, 5) for r in pool.replicas)


@pytest.mark.parametrize(
    "code, status",
    [
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.INTERNAL, 500),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 503),
    ],
)
def test_errors_map_to_http_statuses(code: grpc.StatusCode, status: int) -> None:
    pool, seen = pool_of(code, code)
    with pytest.raises(ApiError) as e:
        asyncio.run(pool.embed(1, 10))
    assert e.value.status == status
    # retryable codes try the second replica; a deadline is not retried (its time is spent)
    assert sum(map(len, seen)) == (1 if code == grpc.StatusCode.DEADLINE_EXCEEDED else 2)


def test_invalid_argument_is_a_400_and_not_retried() -> None:
    pool, seen = pool_of(grpc.StatusCode.INVALID_ARGUMENT, "ok")
    with pytest.raises(ApiError) as e:
        asyncio.run(pool.embed(1, 10))
    assert e.value.status == 400
    assert sum(map(len, seen)) == 1


def test_no_healthy_replica_is_503() -> None:
    pool, seen = pool_of("ok")
    pool.replicas[0].healthy = False
    with pytest.raises(ApiError) as e:
        asyncio.run(pool.embed(1, 10))
    assert (e.value.status, e.value.code) == (503, "no_healthy_replica")
    assert seen == [[]]


def test_a_replica_whose_calls_keep_failing_internal_is_passed_over() -> None:
    # an engine that fails every batch answers fast: it has the fewest outstanding tokens
    pool, seen = pool_of(grpc.StatusCode.INTERNAL, "ok")
    pool.replicas[1].sent_tokens = 5

    async def calls() -> list[Any]:
        return [await pool.embed(n, 10) for n in range(10)]

    assert asyncio.run(calls()) == [1] * 10  # each retried on the other replica
    assert len(seen[0]) == replicas.FAILING_AFTER  # then passed over
    assert pool.choose() is pool.replicas[1]
    pool.replicas[0].avoid_until = 0.0  # AVOID_SECONDS later it is tried again
    assert pool.choose() is pool.replicas[0]


def test_an_avoided_replica_is_still_chosen_when_there_is_no_other() -> None:
    pool, _ = pool_of(grpc.StatusCode.INTERNAL, "ok")
    for _ in range(replicas.FAILING_AFTER):
        asyncio.run(pool.embed(1, 10))
    pool.replicas[1].healthy = False
    assert pool.choose() is pool.replicas[0]


def test_a_success_resets_the_count_of_failed_calls() -> None:
    pool, _ = pool_of("ok")
    replica = pool.replicas[0]
    replica.engine_failures = replicas.FAILING_AFTER - 1
    asyncio.run(pool.embed(1, 10))
    assert replica.engine_failures == 0


def test_replicas_keep_their_ids_and_an_id_is_never_reused(tmp_path: Any) -> None:
    listed = tmp_path / "replicas.txt"
    listed.write_text("127.0.0.1:1\n127.0.0.1:2\n")

    async def main() -> None:
        pool = ReplicaPool(["127.0.0.1:9", f"file:{listed}"], health_interval=0.05)
        for r in pool.replicas:
            r.open()
        await pool.resolve_once()
        ids = {r.address: r.id for r in pool.replicas}
        assert ids == {"127.0.0.1:9": 0, "127.0.0.1:1": 1, "127.0.0.1:2": 2}
        listed.write_text("127.0.0.1:2\n127.0.0.1:3\n")
        await pool.resolve_once()
        # the one that stayed keeps its id (it was list position 1 now), a new one gets a
        # fresh id, never a dropped one's
        assert {r.address: r.id for r in pool.replicas} == {
            "127.0.0.1:9": 0,
            "127.0.0.1:2": 2,
            "127.0.0.1:3": 3,
        }
        await pool.close()

    asyncio.run(main())


def test_replica_metrics_are_labelled_by_address_and_a_dropped_one_goes(tmp_path: Any) -> None:
    from types import SimpleNamespace

    from embedserve.gateway.app import GatewayApp
    from embedserve.gateway.requests import Limits

    listed = tmp_path / "replicas.txt"
    listed.write_text("127.0.0.1:1\n127.0.0.1:2\n")

    async def main() -> None:
        pool = ReplicaPool([f"file:{listed}"])
        await pool.resolve_once()
        pool.replicas[1].healthy = True
        pipeline = SimpleNamespace(replicas=pool)
        app = GatewayApp(lambda: pipeline, Limits(hidden_size=4, max_inputs=8, model_names=("m",)), max_body_bytes=10_000)  # type: ignore[arg-type,return-value]  # fmt: skip
        app.pipeline = pipeline  # type: ignore[assignment]

        async def healthy_series() -> list[str]:
            text = (await app.probes.prometheus(b""))[2].decode()
            return [
                line
                for line in text.splitlines()
                if line.startswith("embedserve_gateway_replica_healthy{")
            ]

        assert await healthy_series() == [
            'embedserve_gateway_replica_healthy{replica="127.0.0.1:1"} 0.0',
            'embedserve_gateway_replica_healthy{replica="127.0.0.1:2"} 1.0',
        ]
        listed.write_text("127.0.0.1:2\n")
        await pool.resolve_once()
        assert await healthy_series() == [
            'embedserve_gateway_replica_healthy{replica="127.0.0.1:2"} 1.0'
        ]
        await pool.close()

    asyncio.run(main())


WORKER = r"""
import sys, time
from types import SimpleNamespace
from embedserve.gateway.metrics import Metrics
healthy = sys.argv[1] == "1"
replica = SimpleNamespace(address="127.0.0.1:7", healthy=healthy, outstanding_tokens=0)
text = Metrics().export([replica]).decode()
print([line for line in text.splitlines() if line.startswith("embedserve_gateway_replica_healthy")])
"""


def test_with_several_workers_a_dead_replica_reads_unhealthy(tmp_path: Any) -> None:
    """Worker A saw the replica healthy (and wrote 1); it died; worker B, scraped now, sees it
    dead: the gauge must read 0, where the largest of the workers' writes said 1."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    run = [sys.executable, "-c", WORKER]
    subprocess.run([*run, "1"], env=env, check=True, capture_output=True)
    out = subprocess.run([*run, "0"], env=env, check=True, capture_output=True, text=True)
    assert out.stdout.strip() == (
        "['embedserve_gateway_replica_healthy{replica=\"127.0.0.1:7\"} 0.0']"
    ), out.stdout
