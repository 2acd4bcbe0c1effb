"""The server calls of one event-loop turn sent as one call.

At many clients a gateway worker reads several requests in one turn of its loop (one wake-up of
its poller), and each used to become a server call of its own. The server's Python work per call
(a frame, a protobuf, a queue entry, a future, an encoded answer) then bounds the whole path,
whatever the engine could batch (issue 38: ~4,000 requests/s on the H200 host at 1 to 4 gateway
workers). Here, calls that fit one message (the same head; no spans, outputs or trace context)
made in one turn go as one `EmbedRequest`, their sequences back to back; the answer's rows are
cut back per call. The first call of a turn schedules the send for the next turn
(`loop.call_soon`), so a lone call waits for nothing but that hop and goes out as before.

Past one turn, a worker keeps at most `max_in_flight` small calls outstanding (small as the
server counts a request, `core.budget.is_small`): the calls made while that many are
out wait, and go merged, in calls that stay small, when one comes back. At 16 clients on 4
workers one turn rarely holds two requests, so without it each query was a server call of its
own, and the server's per-call Python (about 200 µs of one host core on the H200: decode,
queue, three threads' hand-offs, encode, write) bounded the path near 5,000 requests/s with no
model at all. One client never waits (nothing of its is out). A query never waits behind a
large call nor rides in one: large calls go at once and apart, neither counted nor held. Calls
that cannot merge (spans, outputs, a trace context) are neither merged nor bounded.

Each request still gets its own answer or error as if it had gone alone: a merged call the
server refuses for its content (a 4xx) is sent again call by call. A merged call whose members'
clients have all gone is cancelled, as a lone call is (`transport.unless_disconnected`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from embedserve.contract import EmbedRequest, EmbedResponse
from embedserve.core.budget import is_small, small_limit
from embedserve.gateway.errors import ApiError
from embedserve.gateway.replicas import REPLICAS_CALLED

Send = Callable[[Any, int], Awaitable[Any]]
ALONE = object()  # a waiting call's outcome: send yourself, alone
# statuses that may be one call's fault (its tokens, its size): the calls go again one by one
PER_CALL_STATUSES = frozenset({400, 413, 422})
# a gateway worker's bound on small calls out per model (`--calls-in-flight`): 2 against none at
# 16 clients on the H200 +26%, +14%, +20% in three comparisons; 1 lost to 2 in 4 of 6. NOTE:
# `serve` sets none in front of CPU servers, whose own batching merges better: the real model on
# 2 cores, 4 clients, 2 against none -6% (16 clients +2%; flags-ab-cpu-bound-20261204)
CALLS_IN_FLIGHT = 2


@dataclass
class _Waiting:
    request: Any
    num_tokens: int
    answer: asyncio.Future[Any]
    num_seqs: int = field(init=False)
    holds_slot: bool = False  # told ALONE with one of `max_in_flight`'s slots, given back after

    def __post_init__(self) -> None:
        self.num_seqs = len(self.request.seqlens)


def merge_key(request: Any) -> tuple[Any, ...] | None:
    """What calls must share to go as one message (None: this one goes alone)."""
    if request.span_bounds or request.outputs or request.visible_tokens or request.traceparent:
        return None
    return (request.raw, request.dimensions, request.normalize, request.output_dtype, request.lane)


def merge(requests: list[Any]) -> Any:
    """One EmbedRequest of `requests`' sequences back to back (they share a `merge_key`)."""
    first = requests[0]
    second: list[int] = []
    if any(r.second_segment for r in requests):  # a call without it is all type 0
        for r in requests:
            second += r.second_segment or [0] * len(r.seqlens)
    return EmbedRequest(
        input_ids=b"".join(r.input_ids for r in requests),
        seqlens=[n for r in requests for n in r.seqlens],
        second_segment=second,
        dimensions=first.dimensions,
        normalize=first.normalize,
        output_dtype=first.output_dtype,
        raw=first.raw,
        lane=first.lane,
    )


def split(response: Any, num_seqs: list[int]) -> list[Any]:
    """The answer of a merged call cut into one EmbedResponse per call (rows in order)."""
    rows = response.shape[0] if response.shape else 0
    if rows != sum(num_seqs):
        raise ApiError(500, f"a merged call of {sum(num_seqs)} sequences got {rows} rows")
    data = response.embeddings
    row_bytes = len(data) // rows if rows else 0
    out, start = [], 0
    for n in num_seqs:
        out.append(
            EmbedResponse(
                embeddings=data[start * row_bytes : (start + n) * row_bytes],
                shape=[n, *response.shape[1:]],
                dtype=response.dtype,
                # each call was in the merged call's batch: its stage times are theirs
                queue_seconds=response.queue_seconds,
                inference_seconds=response.inference_seconds,
            )
        )
        start += n
    return out


class Coalescer:
    """`await coalescer.embed(request, num_tokens)`: `send`'s answer, the calls of one loop turn
    merged into messages of at most `max_tokens` tokens, and at most `max_in_flight` small ones
    outstanding (0: no bound; see the module docstring)."""

    def __init__(self, send: Send, max_tokens: int, max_in_flight: int = 0) -> None:
        if max_in_flight < 0:
            raise ValueError(f"max_in_flight must be >= 0, got {max_in_flight}")
        self._send = send
        self.max_tokens = max_tokens
        self.max_in_flight = max_in_flight
        self.in_flight = 0  # small calls outstanding
        self._waiting: dict[tuple[Any, ...], list[_Waiting]] = {}
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.num_calls = 0  # server calls made for merged requests
        self.num_merged = 0  # requests that went inside them
        self.on_merged: Callable[[int], None] | None = None  # told each merged call's size

    async def embed(self, request: Any, num_tokens: int) -> Any:
        key = merge_key(request)
        if key is None or num_tokens >= self.max_tokens:
            return await self._send(request, num_tokens)
        waiting = _Waiting(request, num_tokens, asyncio.get_running_loop().create_future())
        self._waiting.setdefault(key, []).append(waiting)
        self._schedule()
        try:
            outcome = await waiting.answer
            if outcome is ALONE:
                return await self._send(request, num_tokens)
        finally:
            if waiting.holds_slot:  # NOTE: also when cancelled between ALONE and its send
                waiting.holds_slot = False
                self._release()
        if isinstance(outcome, BaseException):
            raise outcome
        response, called = outcome
        mine = REPLICAS_CALLED.get()
        if mine is not None:
            mine.update(called)
        return response

    def _schedule(self) -> None:
        """The waiting calls looked at on the loop's next turn (once however many ask)."""
        if not self._scheduled:
            loop = asyncio.get_running_loop()  # first: no loop (closed) leaves nothing marked
            self._scheduled = True
            loop.call_soon(self._flush)

    def _release(self) -> None:
        self.in_flight -= 1
        if self._waiting:
            # NOTE: a member's `finally` may run as its coroutine is collected after the loop
            # closed: nothing is left to flush then
            with contextlib.suppress(RuntimeError):
                self._schedule()

    def _small(self, tokens: int) -> bool:
        """The server's test (`core.budget.is_small`): such a call passes large ones there."""
        return is_small(tokens, self.max_tokens)

    def _flush(self) -> None:
        self._scheduled = False
        groups, self._waiting = self._waiting, {}
        small_part = small_limit(self.max_tokens)  # merged queries stay small there
        for key, calls in groups.items():
            live = [c for c in calls if not c.answer.done()]
            # large calls go now, uncounted, and never with a query inside: a query never
            # waits behind one, here or in a server's batch
            for part in self._parts([c for c in live if not self._small(c.num_tokens)]):
                self._go(part, counted=False)
            parts = self._parts([c for c in live if self._small(c.num_tokens)], small_part)
            for i, part in enumerate(parts):
                if self.max_in_flight and self.in_flight >= self.max_in_flight:
                    self._waiting[key] = [c for held in parts[i:] for c in held]
                    break  # they wait for a slot: `_release` looks again
                self._go(part, counted=True)

    def _go(self, part: list[_Waiting], counted: bool) -> None:
        """Send `part` (holding one of `max_in_flight`'s slots when `counted`)."""
        self.in_flight += counted
        if len(part) == 1:  # its own task sends it: no task of ours in between
            part[0].holds_slot = counted
            part[0].answer.set_result(ALONE)
            return
        task = asyncio.get_running_loop().create_task(self._together(part, counted))
        self._tasks.add(task)  # NOTE: a reference, or the loop may drop the task
        task.add_done_callback(self._tasks.discard)

        def member_left(_: asyncio.Future[Any]) -> None:
            # every member's client gone (their waits cancelled) before the answer: the merged
            # call is cancelled too, so the server drops it and its slot is given back
            if not task.done() and all(c.answer.cancelled() for c in part):
                task.cancel()

        for call in part:
            call.answer.add_done_callback(member_left)

    def _parts(self, calls: list[_Waiting], limit: int | None = None) -> list[list[_Waiting]]:
        """`calls` in order, cut into parts of at most `limit` tokens (`max_tokens`)."""
        limit = limit or self.max_tokens
        parts: list[list[_Waiting]] = []
        tokens = limit
        for call in calls:
            if tokens + call.num_tokens > limit:
                parts.append([])
                tokens = 0
            parts[-1].append(call)
            tokens += call.num_tokens
        return parts

    async def _together(self, part: list[_Waiting], holds_slot: bool) -> None:
        try:
            await self._merged(part)
        finally:
            if holds_slot:
                self._release()
            for call in part:  # `_merged` was cancelled before it answered: none may hang
                if not call.answer.done():
                    call.answer.set_exception(
                        ApiError(503, "the server call was cancelled", code="unavailable")
                    )

    async def _merged(self, part: list[_Waiting]) -> None:
        called: set[int] = set()
        REPLICAS_CALLED.set(called)  # this task's own context: the members get it below
        try:
            self.num_calls += 1
            self.num_merged += len(part)
            if self.on_merged is not None:
                self.on_merged(len(part))
            response = await self._send(
                merge([c.request for c in part]), sum(c.num_tokens for c in part)
            )
            answers: list[Any] = [(r, called) for r in split(response, [c.num_seqs for c in part])]
        except ApiError as e:
            answers = [ALONE if e.status in PER_CALL_STATUSES else e] * len(part)
        except Exception as e:  # the members fail as the call did
            answers = [e] * len(part)
        for call, answer in zip(part, answers, strict=True):
            if call.answer.done():  # a member whose client went away is cancelled
                continue
            if answer is ALONE and self._small(call.num_tokens):
                call.holds_slot = True  # its call alone, counted like any other small one
                self.in_flight += 1
            call.answer.set_result(answer)
