"""The server calls of one loop turn as one message (`gateway.coalescing`), against a fake send
that answers each sequence with a row made of its own ids."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from embedserve.contract import EmbedResponse
from embedserve.contract.codec import decode_response, encode_request
from embedserve.core.head import Head
from embedserve.gateway.coalescing import CALLS_IN_FLIGHT, Coalescer
from embedserve.gateway.errors import ApiError
from embedserve.gateway.replicas import REPLICAS_CALLED

HEAD = Head(2, True, "float32")
BAD_ID = 666  # a call holding it is refused (400) by the fake server


class FakeServer:
    def __init__(self, fail: ApiError | None = None) -> None:
        self.sent: list[Any] = []
        self.fail = fail

    async def send(self, request: Any, num_tokens: int) -> Any:
        self.sent.append(request)
        await asyncio.sleep(0)
        called = REPLICAS_CALLED.get()
        if called is not None:
            called.add(7)
        ids = np.frombuffer(request.input_ids, dtype="<i4")
        if self.fail is not None:
            raise self.fail
        if BAD_ID in ids:
            raise ApiError(400, "token id out of the vocabulary")
        starts = np.concatenate([[0], np.cumsum(request.seqlens)[:-1]]).astype(int)
        rows = np.stack([ids[starts], np.asarray(request.seqlens)], axis=1).astype("<f4")
        return EmbedResponse(embeddings=rows.tobytes(), shape=list(rows.shape), dtype="float32")


def rows(response: Any, n: int) -> list[list[float]]:
    return decode_response(response, n).tolist()


async def gather(coalescer: Coalescer, *calls: list[list[int]], head: Head | None = HEAD) -> list:
    requests = [encode_request(seqs, head) for seqs in calls]
    return await asyncio.gather(
        *(coalescer.embed(r, sum(map(len, s))) for r, s in zip(requests, calls, strict=True)),
        return_exceptions=True,
    )


def test_calls_of_one_turn_go_as_one_message_and_each_gets_its_rows() -> None:
    server = FakeServer()
    coalescer = Coalescer(server.send, max_tokens=100)
    out = asyncio.run(gather(coalescer, [[1, 2]], [[3], [4, 5, 6]], [[8]]))
    assert len(server.sent) == 1
    assert list(server.sent[0].seqlens) == [2, 1, 3, 1]
    assert rows(out[0], 1) == [[1, 2]]
    assert rows(out[1], 2) == [[3, 1], [4, 3]]
    assert rows(out[2], 1) == [[8, 1]]
    assert (coalescer.num_calls, coalescer.num_merged) == (1, 3)


def test_a_lone_call_goes_as_it_is() -> None:
    server = FakeServer()
    request = encode_request([[1, 2, 3]], HEAD)
    out = asyncio.run(Coalescer(server.send, 100).embed(request, 3))
    assert server.sent == [request]
    assert rows(out, 1) == [[1, 3]]


def test_calls_with_other_heads_or_spans_are_not_merged() -> None:
    server = FakeServer()
    coalescer = Coalescer(server.send, 100)

    async def calls() -> list[Any]:
        a = encode_request([[1]], HEAD)
        b = encode_request([[2]], Head(2, False, "float32"))
        c = encode_request([[3, 4]], HEAD, spans=np.array([[0, 1]]))
        d = encode_request([[5]], None)  # raw rows
        return await asyncio.gather(*(coalescer.embed(r, 2) for r in (a, b, c, d)))

    asyncio.run(calls())
    assert sorted(len(r.seqlens) for r in server.sent) == [1, 1, 1, 1]
    assert coalescer.num_calls == 0


def test_merged_messages_stay_under_the_token_budget() -> None:
    server = FakeServer()
    out = asyncio.run(gather(Coalescer(server.send, 4), [[1, 1]], [[2, 2]], [[3, 3]], [[4]]))
    assert [list(r.seqlens) for r in server.sent] == [[2, 2], [2, 1]]
    assert [rows(o, 1)[0][0] for o in out] == [1, 2, 3, 4]


def test_a_call_refused_for_its_content_fails_alone() -> None:
    server = FakeServer()
    out = asyncio.run(gather(Coalescer(server.send, 100), [[1]], [[BAD_ID, 2]], [[3]]))
    assert rows(out[0], 1) == [[1, 1]] and rows(out[2], 1) == [[3, 1]]
    assert isinstance(out[1], ApiError) and out[1].status == 400
    assert len(server.sent) == 4  # the merged call, then each call alone


def test_a_failed_server_fails_every_member_once() -> None:
    server = FakeServer(fail=ApiError(503, "no healthy server replica"))
    out = asyncio.run(gather(Coalescer(server.send, 100), [[1]], [[2]]))
    assert all(isinstance(o, ApiError) and o.status == 503 for o in out)
    assert len(server.sent) == 1


def test_pairs_merge_with_their_token_types() -> None:
    server = FakeServer()
    coalescer = Coalescer(server.send, 100)

    async def calls() -> None:
        a = encode_request([[1, 2, 3]], None, second_segment=[2])
        b = encode_request([[4, 5]], None)
        await asyncio.gather(coalescer.embed(a, 3), coalescer.embed(b, 2))

    asyncio.run(calls())
    assert list(server.sent[0].second_segment) == [2, 0]


def test_a_cancelled_member_leaves_the_others_their_answers() -> None:
    server = FakeServer()
    coalescer = Coalescer(server.send, 100)

    async def calls() -> list[Any]:
        a = asyncio.ensure_future(coalescer.embed(encode_request([[1]], HEAD), 1))
        b = asyncio.ensure_future(coalescer.embed(encode_request([[2]], HEAD), 1))
        c = asyncio.ensure_future(coalescer.embed(encode_request([[3]], HEAD), 1))
        await asyncio.sleep(0)  # all three wait for the send
        b.cancel()
        return await asyncio.gather(a, b, c, return_exceptions=True)

    out = asyncio.run(calls())
    assert rows(out[0], 1) == [[1, 1]] and rows(out[2], 1) == [[3, 1]]
    assert isinstance(out[1], asyncio.CancelledError)
    assert list(server.sent[0].seqlens) == [1, 1]


def test_a_merged_call_whose_clients_all_left_is_cancelled_and_gives_its_slot_back() -> None:
    """Faults IV: dead work ran to its end and held a calls-in-flight slot."""
    started, cancelled = asyncio.Event(), []

    async def slow_send(request: Any, num_tokens: int) -> Any:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(request)
            raise

    coalescer = Coalescer(slow_send, 100, max_in_flight=1)

    async def calls() -> None:
        members = [asyncio.ensure_future(coalescer.embed(encode_request([[i]], HEAD), 1))
                   for i in (1, 2)]  # fmt: skip
        await asyncio.wait_for(started.wait(), 5)
        assert coalescer.in_flight == 1
        for m in members:
            m.cancel()  # both clients leave
        await asyncio.gather(*members, return_exceptions=True)
        for _ in range(5):
            await asyncio.sleep(0)
        # while the loop still runs (it would cancel what is left when it ends)
        assert len(cancelled) == 1 and list(cancelled[0].seqlens) == [1, 1]
        assert coalescer.in_flight == 0

    asyncio.run(calls())


def test_each_member_learns_the_replicas_its_call_went_to() -> None:
    server = FakeServer()
    coalescer = Coalescer(server.send, 100)

    async def one(ids: list[int]) -> set[int]:
        mine: set[int] = set()
        REPLICAS_CALLED.set(mine)
        await coalescer.embed(encode_request([ids], HEAD), 1)
        return mine

    async def calls() -> list[set[int]]:
        return await asyncio.gather(one([1]), one([2]))

    assert asyncio.run(calls()) == [{7}, {7}]


@pytest.mark.parametrize("dtype", ["int8", "binary"])
def test_encoded_rows_are_cut_by_their_bytes(dtype: str) -> None:
    response = EmbedResponse(
        embeddings=bytes(range(12)),
        shape=[3, 4],
        dtype=dtype,
        queue_seconds=0.25,
        inference_seconds=0.5,
    )
    from embedserve.gateway.coalescing import split

    parts = split(response, [1, 2])
    assert [p.embeddings for p in parts] == [bytes(range(4)), bytes(range(4, 12))]
    assert [list(p.shape) for p in parts] == [[1, 4], [2, 4]]
    # the TEI timing headers of each call read the merged call's stage times
    assert all((p.queue_seconds, p.inference_seconds) == (0.25, 0.5) for p in parts)


def test_merged_calls_are_counted_for_the_metrics() -> None:
    from embedserve.gateway.metrics import Metrics

    server, metrics = FakeServer(), Metrics()
    coalescer = Coalescer(server.send, max_tokens=100)
    coalescer.on_merged = metrics.merged("minilm")
    asyncio.run(gather(coalescer, [[1]], [[2]], [[3]]))
    asyncio.run(gather(coalescer, [[4]]))  # alone: not a merged call
    text = metrics.export(None).decode()
    assert "embedserve_gateway_merged_calls_total 1.0" in text
    assert "embedserve_gateway_merged_requests_total 3.0" in text


class GatedServer(FakeServer):
    """Answers each call only once its gate is opened (`release`), so tests choose what is out."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[asyncio.Event] = []

    async def send(self, request: Any, num_tokens: int) -> Any:
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return await super().send(request, num_tokens)

    def release(self, index: int) -> None:
        self.gates[index].set()


async def settle() -> None:
    for _ in range(5):  # a few loop turns: the flush, the sends, the answers
        await asyncio.sleep(0)


def call(coalescer: Coalescer, ids: list[int]) -> asyncio.Future[Any]:
    return asyncio.ensure_future(coalescer.embed(encode_request([ids], HEAD), len(ids)))


def test_calls_made_while_the_bound_is_out_wait_and_go_as_one() -> None:
    server = GatedServer()
    coalescer = Coalescer(server.send, max_tokens=800, max_in_flight=1)

    async def calls() -> list[Any]:
        first = call(coalescer, [1])
        await settle()
        assert len(server.sent) == 0 and len(server.gates) == 1  # out, not answered
        later = [call(coalescer, [i]) for i in (2, 3)]
        await settle()
        later.append(call(coalescer, [4]))  # another turn: waits with them
        await settle()
        assert len(server.gates) == 1 and coalescer.in_flight == 1
        server.release(0)
        await settle()
        assert len(server.gates) == 2  # the three waiting calls: one message
        server.release(1)
        return await asyncio.gather(first, *later)

    out = asyncio.run(asyncio.wait_for(calls(), 10))  # a lost slot: fail, not hang
    assert [list(r.seqlens) for r in server.sent] == [[1], [1, 1, 1]]
    assert [rows(o, 1)[0][0] for o in out] == [1, 2, 3, 4]
    assert coalescer.in_flight == 0


def test_one_client_never_waits() -> None:
    server = FakeServer()
    coalescer = Coalescer(server.send, max_tokens=800, max_in_flight=1)

    async def calls() -> None:
        for i in range(1, 4):
            await coalescer.embed(encode_request([[i]], HEAD), 1)
            assert coalescer.in_flight == 0 and not coalescer._waiting

    asyncio.run(asyncio.wait_for(calls(), 10))  # a lost slot: fail, not hang
    assert [list(r.seqlens) for r in server.sent] == [[1], [1], [1]]
    assert coalescer.in_flight == 0


def test_large_calls_neither_wait_nor_hold_a_slot() -> None:
    server = GatedServer()
    coalescer = Coalescer(server.send, max_tokens=800, max_in_flight=1)
    large = list(range(1, 101))  # 100 tokens: not under 800 / SMALL_SHARE

    async def calls() -> None:
        small = call(coalescer, [1])
        await settle()
        big = call(coalescer, large)
        await settle()
        assert len(server.gates) == 2  # went at once, beside the small call
        server.release(1)
        await big
        assert coalescer.in_flight == 1  # only the small call holds one
        server.release(0)
        await small

    asyncio.run(asyncio.wait_for(calls(), 10))  # a lost slot: fail, not hang
    assert coalescer.in_flight == 0


def test_a_waiting_call_cancelled_gives_nothing_back_twice() -> None:
    server = GatedServer()
    coalescer = Coalescer(server.send, max_tokens=800, max_in_flight=1)

    async def calls() -> None:
        first = call(coalescer, [1])
        await settle()
        gone = call(coalescer, [2])
        await settle()
        gone.cancel()
        await settle()
        server.release(0)
        await first
        await settle()
        assert coalescer.in_flight == 0 and len(server.gates) == 1  # the cancelled one: unsent
        again = call(coalescer, [3])
        await settle()
        assert len(server.gates) == 2
        server.release(1)
        await again

    asyncio.run(asyncio.wait_for(calls(), 10))  # a lost slot: fail, not hang
    assert coalescer.in_flight == 0


def test_a_call_cancelled_after_its_slot_was_given_releases_it() -> None:
    server = GatedServer()
    coalescer = Coalescer(server.send, max_tokens=800, max_in_flight=1)

    async def calls() -> None:
        first = call(coalescer, [1])
        await settle()
        second = call(coalescer, [2])
        await settle()
        server.release(0)
        await first
        while coalescer._waiting:  # until the flush gives `second` the slot (ALONE) ...
            await asyncio.sleep(0)
        assert coalescer.in_flight == 1 and len(server.gates) == 1  # ... before its send
        second.cancel()
        await settle()
        assert second.cancelled() and len(server.gates) == 1

    asyncio.run(asyncio.wait_for(calls(), 10))  # a lost slot: fail, not hang
    assert coalescer.in_flight == 0


def test_a_large_call_is_not_held_behind_queries_waiting_for_a_slot() -> None:
    server = GatedServer()
    coalescer = Coalescer(server.send, max_tokens=800, max_in_flight=1)
    large = [5] * 750  # 750 tokens: mergeable (under 800), not small

    async def calls() -> None:
        first = call(coalescer, [1])
        await settle()
        query, big = call(coalescer, [2]), call(coalescer, large)
        await settle()
        assert len(server.gates) == 2  # the large call went; the query waits for the slot
        assert [len(r) for r in coalescer._waiting.values()] == [1]
        server.release(1)
        await big
        server.release(0)
        await first
        await settle()
        server.release(2)
        await query

    asyncio.run(asyncio.wait_for(calls(), 10))  # a lost slot: fail, not hang
    # no message held the query beside the large call: it stays small at the server
    assert sorted(list(r.seqlens) for r in server.sent) == [[1], [1], [750]]
    assert coalescer.in_flight == 0


def test_merged_queries_stay_small_at_the_server() -> None:
    server = GatedServer()
    coalescer = Coalescer(server.send, max_tokens=80, max_in_flight=1)  # small: under 10 tokens

    async def calls() -> list[Any]:
        first = call(coalescer, [1])
        await settle()
        waiting = [call(coalescer, [i] * 4) for i in range(2, 7)]  # 5 calls of 4 tokens
        await settle()
        server.release(0)
        await first
        for gate in range(1, 4):  # one merged call of at most 9 tokens at a time
            await settle()
            assert len(server.gates) == gate + 1
            server.release(gate)
        return await asyncio.gather(*waiting)

    out = asyncio.run(asyncio.wait_for(calls(), 10))  # a lost slot: fail, not hang
    assert [list(r.seqlens) for r in server.sent] == [[1], [4, 4], [4, 4], [4]]
    assert [rows(o, 1)[0][0] for o in out] == [2, 3, 4, 5, 6]


def test_calls_sent_alone_after_a_merged_refusal_are_counted() -> None:
    seen: list[int] = []
    server = FakeServer()
    coalescer = Coalescer(server.send, max_tokens=800, max_in_flight=1)

    async def send(request: Any, num_tokens: int) -> Any:
        seen.append(coalescer.in_flight)
        return await server.send(request, num_tokens)

    coalescer._send = send
    out = asyncio.run(asyncio.wait_for(gather(coalescer, [[1]], [[BAD_ID, 2]], [[3]]), 10))
    assert isinstance(out[1], ApiError) and out[1].status == 400
    assert len(seen) == 4 and all(n >= 1 for n in seen)  # the merged call, then each alone
    assert coalescer.in_flight == 0


def test_a_failing_send_or_metrics_hook_leaves_no_member_waiting_and_no_slot_taken() -> None:
    async def broken(request: Any, num_tokens: int) -> Any:
        await asyncio.sleep(0)
        raise ConnectionResetError("the socket went away")

    coalescer = Coalescer(broken, max_tokens=800, max_in_flight=1)
    out = asyncio.run(asyncio.wait_for(gather(coalescer, [[1]], [[2]], [[3]]), 10))
    assert all(isinstance(o, ConnectionResetError) for o in out)
    assert coalescer.in_flight == 0

    def hook(size: int) -> None:
        raise RuntimeError("metrics broke")

    coalescer = Coalescer(FakeServer().send, max_tokens=800, max_in_flight=1)
    coalescer.on_merged = hook
    out = asyncio.run(asyncio.wait_for(gather(coalescer, [[1]], [[2]]), 10))
    assert all(isinstance(o, RuntimeError) for o in out)
    assert coalescer.in_flight == 0


def test_the_gateway_flag_reaches_each_models_coalescer() -> None:
    from embedserve.gateway.main import GatewayConfig
    from embedserve.gateway.pipeline import Pipeline, PipelineLimits

    assert GatewayConfig(replicas=("127.0.0.1:1",)).calls_in_flight is None  # the default's
    with pytest.raises(ValueError, match="calls_in_flight"):
        GatewayConfig(replicas=("127.0.0.1:1",), calls_in_flight=-1)

    class Inputs:
        spec = type("Spec", (), {"retrieval": None})()

    limits = PipelineLimits(1000, 800, calls_in_flight=1)
    assert Pipeline(Inputs(), None, limits).calls.max_in_flight == 1  # type: ignore[arg-type]
    default = Pipeline(Inputs(), None, PipelineLimits(1000, 800))  # type: ignore[arg-type]
    assert default.calls.max_in_flight == CALLS_IN_FLIGHT == 2


def test_the_bound_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        Coalescer(FakeServer().send, 100, max_in_flight=-1)
