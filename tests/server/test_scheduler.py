"""The server queue: FCFS batches of whole requests under a token budget, backpressure, drops."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest

from embedserve.core.budget import split_rows
from embedserve.core.head import Head
from embedserve.engine.batch import PackedBatch
from embedserve.server.scheduler import (
    Overloaded,
    Pending,
    Scheduler,
    SchedulerConfig,
    pack,
)


def request(*seqlens: int, first_id: int = 1, cancelled: bool = False) -> Pending:
    lens = np.array(seqlens, dtype=np.int32)
    ids = np.arange(first_id, first_id + int(lens.sum()), dtype=np.int32)
    result: Future[object] = Future()  # only `done()` matters here
    if cancelled:
        result.cancel()
    return Pending(PackedBatch.from_packed(ids, lens), Head(384, True, "float32"), None, result)  # type: ignore[arg-type]


def test_batches_are_whole_requests_in_arrival_order_under_the_budget() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=100, max_queued_tokens=10_000))
    reqs = [request(30), request(20, 20), request(50), request(10)]
    for r in reqs:
        sched.submit(r)
    assert sched.num_queued_tokens == 130
    assert sched.next_batch() == reqs[:2]  # 70 tokens; the next 50 would pass 100
    assert sched.next_batch() == reqs[2:]  # 60 tokens
    assert sched.next_batch() == []
    assert sched.num_queued_tokens == 0


def test_a_request_larger_than_the_budget_runs_alone() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=64, max_queued_tokens=10_000))
    small, big, after = request(8), request(500), request(8)
    for r in (small, big, after):
        sched.submit(r)
    assert sched.next_batch() == [small]
    assert sched.next_batch() == [big]
    assert sched.next_batch() == [after]


def test_cancelled_requests_are_dropped_before_the_engine() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=100, max_queued_tokens=10_000))
    gone, kept = request(10, cancelled=True), request(10)
    sched.submit(gone)
    sched.submit(kept)
    assert sched.next_batch() == [kept]
    assert sched.num_dropped == 1
    # one cancelled behind the head of the queue is dropped too, not run
    first, gone, last = request(10), request(10, cancelled=True), request(10)
    for r in (first, gone, last):
        sched.submit(r)
    assert sched.next_batch() == [first, last]
    assert sched.num_dropped == 2
    assert sched.num_queued_tokens == 0


def test_backpressure_refuses_beyond_max_queued_tokens() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=100, max_queued_tokens=100))
    sched.submit(request(60))
    sched.submit(request(40))
    with pytest.raises(Overloaded, match="queue is full"):
        sched.submit(request(1))
    assert sched.num_queued_tokens == 100
    sched.next_batch()
    sched.submit(request(100))  # room again once the queue drains


def test_an_oversized_request_is_taken_when_the_queue_is_empty() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=10, max_queued_tokens=10))
    big = request(50)
    sched.submit(big)
    assert sched.next_batch() == [big]


def test_pack_and_split_round_trip_in_order() -> None:
    reqs = [request(3, first_id=1), request(2, 4, first_id=100), request(1, first_id=500)]
    packed = pack(reqs)
    assert packed.input_ids.tolist() == [1, 2, 3, 100, 101, 102, 103, 104, 105, 500]
    assert packed.seqlens.tolist() == [3, 2, 4, 1]
    assert pack(reqs[:1]) is reqs[0].batch  # a request alone is not packed again
    pooled = np.arange(4 * 2, dtype=np.float32).reshape(4, 2)
    parts = split_rows(pooled, [r.num_rows for r in reqs])
    assert [p.shape[0] for p in parts] == [1, 2, 1]
    np.testing.assert_array_equal(np.concatenate(parts), pooled)
    with pytest.raises(RuntimeError, match="rows"):
        split_rows(pooled[:3], [r.num_rows for r in reqs])


@pytest.mark.parametrize("batch, queued", [(0, 10), (10, -1)])
def test_config_is_validated(batch: int, queued: int) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        SchedulerConfig(batch, queued)


def test_small_requests_pass_a_large_one_once() -> None:
    """A query behind a large request's parts waits for one large batch, not for every part;
    and the large request is passed once per batch, never starved."""
    sched = Scheduler(SchedulerConfig(max_batch_tokens=800, max_queued_tokens=10_000))
    part1, part2 = request(700), request(700)
    q1, q2, q3 = request(10), request(12), request(9)
    for r in (part1, part2, q1, q2):
        sched.submit(r)
    assert sched.next_batch() == [q1, q2]  # the queries first, once
    sched.submit(q3)
    assert sched.next_batch() == [part1]  # then the large request, whatever waits
    assert sched.next_batch() == [q3]
    assert sched.next_batch() == [part2]
    assert sched.next_batch() == []
    assert sched.num_queued_tokens == 0


def test_only_small_requests_pass_and_a_small_front_keeps_arrival_order() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=800, max_queued_tokens=10_000))
    large, medium, small = request(750), request(100), request(10)
    gone = request(5, cancelled=True)
    for r in (large, medium, gone, small):
        sched.submit(r)
    assert sched.next_batch() == [small]  # 100 tokens is not small (8 x 100 >= 800)
    assert sched.next_batch() == [large]
    assert sched.next_batch() == [medium]
    half, query = request(400), request(10)  # not more than half the budget: not large
    sched.submit(half)
    sched.submit(query)
    assert sched.next_batch() == [half, query]
