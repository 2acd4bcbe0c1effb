"""Replica choice (fewest outstanding tokens, healthy only) and the one retry, with fake stubs."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

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
    a.outstanding_tokens, b.outstanding_tokens, c.outstanding_tokens = 50, 10, 0
    c.healthy = False
    assert pool.choose() is b
    assert pool.choose(exclude=b) is a
    a.healthy = b.healthy = False
    assert pool.choose() is None


def test_a_failed_call_is_retried_once_on_another_replica() -> None:
    pool, seen = pool_of(grpc.StatusCode.UNAVAILABLE, "ok")
    pool.replicas[1].outstanding_tokens = 5  # so the first choice is the failing replica
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
