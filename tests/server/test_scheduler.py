"""The server queue: FCFS batches of whole requests under a token budget, backpressure, drops."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest

from embedserve.core.budget import split_rows
from embedserve.core.head import Head
from embedserve.engine.batch import PackedBatch
from embedserve.server.scheduler import (
    BULK_EVERY,
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


def lane(*seqlens: int, bulk: bool = False, cancelled: bool = False) -> Pending:
    r = request(*seqlens, cancelled=cancelled)
    r.bulk = bulk
    return r


def test_interactive_work_goes_first_at_a_batch_boundary() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=100, max_queued_tokens=10_000))
    bulk = [lane(90, bulk=True) for _ in range(3)]
    for r in bulk:
        sched.submit(r)
    assert sched.next_batch() == [bulk[0]]  # alone: bulk runs
    query = lane(8)
    sched.submit(query)  # arrives while bulk[0] runs: next at the boundary, before bulk[1]
    assert sched.next_batch() == [query]
    assert sched.next_batch() == [bulk[1]]
    assert sched.next_batch() == [bulk[2]]
    assert sched.num_queued_tokens == 0 and sched.num_bulk_batches == 3


def test_bulk_keeps_one_batch_in_bulk_every_under_a_constant_interactive_stream() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=100, max_queued_tokens=100_000))
    for _ in range(10):
        sched.submit(lane(90, bulk=True))
    taken = []
    for _ in range(40):
        sched.submit(lane(60))  # a query per batch, each filling most of one
        taken.append(sched.next_batch()[0].bulk)
    # one batch in BULK_EVERY is bulk's, on the dot, while both lanes wait
    assert taken == ([False] * (BULK_EVERY - 1) + [True]) * (40 // BULK_EVERY)


def test_each_lane_is_first_come_first_served() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=10, max_queued_tokens=10_000))
    reqs = [lane(10, bulk=i % 2 == 1) for i in range(8)]
    for r in reqs:
        sched.submit(r)
    order = [sched.next_batch()[0] for _ in range(8)]
    assert [r for r in order if not r.bulk] == reqs[0::2]
    assert [r for r in order if r.bulk] == reqs[1::2]


def test_cancelled_requests_are_dropped_in_both_lanes() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=100, max_queued_tokens=10_000))
    gone_q, gone_b, kept = lane(10, cancelled=True), lane(10, bulk=True, cancelled=True), lane(5)
    kept_b = lane(10, bulk=True)
    for r in (gone_q, gone_b, kept_b, kept):
        sched.submit(r)
    queued = lane(20, bulk=True)
    sched.submit(queued)
    queued.result.cancel()
    sched.cancel(queued)  # its tokens leave at once, before it reaches its lane's front
    assert sched.num_queued_tokens == 35
    assert sched.next_batch() == [kept]
    assert sched.next_batch() == [kept_b]  # queued (behind it, cancelled) dropped in the batch
    assert sched.next_batch() == []
    assert sched.num_dropped == 3 and sched.num_queued_tokens == 0 and len(sched) == 0


def test_with_lanes_off_every_request_is_in_one_fcfs_queue() -> None:
    config = SchedulerConfig(max_batch_tokens=100, max_queued_tokens=10_000, lanes=False)
    sched = Scheduler(config)
    first, query = lane(90, bulk=True), lane(8)
    second = lane(90, bulk=True)
    for r in (first, second, query):
        sched.submit(r)
    # FCFS, the small-passes-large-once rule as before: the query passes `first` once
    assert sched.next_batch() == [query]
    assert sched.next_batch() == [first]
    assert sched.next_batch() == [second]
