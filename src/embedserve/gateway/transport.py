"""The ASGI side of a request: its body, read under a size and a time limit and parsed as
JSON, and the client's disconnect, which cancels the work done for it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from embedserve.gateway.errors import ApiError, bad_request
from embedserve.gateway.jsonio import (
    MAX_JSON_DEPTH,
    JSONDecodeError,
    count_strings,
    count_values,
    duplicate_key,
    loads,
)
from embedserve.gateway.requests import Limits

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Answer = tuple[int, bytes, bytes]  # status, content type, body
RETRYABLE_STATUSES = (429, 503)
RETRY_AFTER_SECONDS = b"1"


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was ready (while it sent its body, or
    while the work for it ran): an ordinary event, answered by nobody and logged at info."""


async def read_body(scope: Scope, receive: Receive, limit: int, timeout: float) -> bytes:
    """The whole body, at most `limit` bytes, arriving within `timeout` s of its headers."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise _too_large(limit)
    chunks, size = [], 0
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            raise ApiError(
                408,
                f"the request body did not arrive within {timeout:g} s",
                code="body_timeout",
                headers=((b"connection", b"close"),),  # the rest of it is not awaited
            ) from None
        if message["type"] == "http.disconnect":  # mid-upload: nobody is left to answer
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is over the limit of {limit} bytes", code="body_too_large")


# NOTE: every request object has at most ~10 fields; a body with more at its top level is refused
# before its duplicate keys are looked for (that scan is a pass per distinct name)
MAX_TOP_LEVEL_FIELDS = 64


def max_json_strings(limits: Limits) -> int:
    """The most JSON strings any valid request of `limits` holds: its fields, and two per input
    or document (a document object's key and text), twice over for pairs (`text_1`, `text_2`),
    or one per chunk of a contextualized request."""
    per_item = max(4 * limits.max_inputs, limits.max_request_chunks)
    return per_item + 2 * MAX_TOP_LEVEL_FIELDS


def max_json_values(limits: Limits, max_tokens: int) -> int:
    """The most JSON values other than strings any valid request of `limits` holds: a token id
    per token (`max_tokens`), a list and an object per input or document, twice over for pairs,
    and its fields."""
    return max_tokens + 4 * limits.max_inputs + 2 * MAX_TOP_LEVEL_FIELDS


def parse_json(body: bytes, max_strings: int, max_values: int | None = None) -> Any:
    """The body as JSON; empty, invalid, with more strings than `max_strings` or more other
    values than `max_values` (None: no bound) or nested deeper than `MAX_JSON_DEPTH` (all
    counted before parsing: the parser's cost grows with values, not bytes), or with a key
    twice at the top level: a 400."""
    if not body:
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    strings = count_strings(body)
    if strings > max_strings:
        raise bad_request(
            f"the body holds about {strings} JSON strings, over the {max_strings} any request "
            "of these limits needs",
            code="too_many_values",
        )
    values, depth = count_values(body, max_values if max_values is not None else len(body) + 1)
    if max_values is not None and values > max_values:
        raise bad_request(
            f"the body holds over {max_values} JSON values besides strings (arrays, objects, "
            "numbers), more than any request of these limits needs",
            code="too_many_values",
        )
    if depth > MAX_JSON_DEPTH:
        raise bad_request(
            f"the body nests arrays or objects over {MAX_JSON_DEPTH} deep; no request nests "
            "more than a few levels",
            code="invalid_json",
        )
    try:
        parsed = loads(body)
    except JSONDecodeError as e:
        raise bad_request(f"the body is not valid JSON: {e}", code="invalid_json") from None
    if isinstance(parsed, dict) and len(parsed) > MAX_TOP_LEVEL_FIELDS:
        raise bad_request(
            f"the request has {len(parsed)} fields; no request has over {MAX_TOP_LEVEL_FIELDS}",
            code="unknown_parameter",
        )
    try:
        key = duplicate_key(body, parsed)
    except ValueError as e:  # nested deeper than the checking parser goes
        raise bad_request(f"the body is not valid JSON: {e}", code="invalid_json") from None
    if key is not None:
        raise bad_request(
            f"the key {key!r} appears twice in the request; send it once",
            param=key,
            code="duplicate_key",
        )
    return parsed


async def unless_disconnected(work: Awaitable[Answer], receive: Receive) -> Answer:
    """`await work`, unless the client disconnects first: then cancel it, which cancels its
    server calls, so the servers drop those requests before they reach the engine."""
    current = asyncio.current_task()
    assert current is not None
    gone = False

    def on_message(watch: asyncio.Future[dict[str, Any]]) -> None:
        nonlocal gone
        if watch.cancelled() or watch.exception() is not None:
            return
        if watch.result()["type"] == "http.disconnect":
            gone = True
            current.cancel()

    # The body is read: the next message is a disconnect, whenever it comes.
    watch = asyncio.ensure_future(receive())
    watch.add_done_callback(on_message)
    try:
        return await work
    except asyncio.CancelledError:
        if gone:
            current.uncancel()
            raise ClientGone from None
        raise
    finally:
        watch.remove_done_callback(on_message)
        watch.cancel()


async def send_answer(
    send: Send, status: int, content_type: bytes, payload: bytes, extra: Any
) -> None:
    """The answer, its length and `extra` headers; a retry-after on a status that clears
    quickly (full queues, restarting replicas)."""
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(payload)).encode()),
        *extra,
    ]
    if status in RETRYABLE_STATUSES:
        headers.append((b"retry-after", RETRY_AFTER_SECONDS))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
