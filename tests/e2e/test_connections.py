"""Bounded connections on a real `embedserve serve`: oversized or too many headers get 431 at
once, headers or a body that trickle get 408 when their timeout passes, and everyone else is
still served meanwhile."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from tests.e2e.conftest import Proc
from tests.e2e.test_replica_failure import call

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bounded() -> Iterator[tuple[str, int]]:
    proc = Proc("serve", "--port", "0", "--device", "cpu", "--workers", "1",
                "--header-timeout", "1", "--body-timeout", "1")  # fmt: skip
    try:
        url = proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
        port = urlparse(url).port
        assert port is not None
        yield url, port
    finally:
        proc.stop()


def exchange(
    port: int, data: bytes, *, pause: float = 0.0, tail: bytes = b""
) -> tuple[bytes, float]:
    """Send `data`, wait `pause`, send `tail`; the whole answer until the server closes, and the
    seconds from the first byte sent to the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        start = time.monotonic()
        try:
            s.sendall(data)
            if pause:
                time.sleep(pause)
            if tail:
                s.sendall(tail)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may close while we still send: read what it answered
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks), time.monotonic() - start


def test_oversized_headers_get_431_at_once(bounded: tuple[str, int]) -> None:
    url, port = bounded
    big = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
        + b"a" * (4 << 20)
        + b"\r\n\r\n"
    )
    answer, took = exchange(port, big)
    assert answer.startswith(b"HTTP/1.1 431") and took < 1.0, (answer[:200], took)
    many = (
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + b"".join(b"X-%d: y\r\n" % i for i in range(150))
        + b"\r\n"
    )
    answer, _ = exchange(port, many)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert call(url, "POST", "/v1/embeddings", {"input": "still served"})[0] == 200


def test_trickling_headers_and_bodies_get_408(bounded: tuple[str, int]) -> None:
    url, port = bounded
    answer, took = exchange(port, b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n", pause=3.0)
    assert answer.startswith(b"HTTP/1.1 408") and 0.9 < took < 3.5, (answer[:200], took)
    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    answer, took = exchange(port, head + b'Content-Length: 100\r\n\r\n{"inp', pause=3.0)
    assert b" 408 " in answer.split(b"\r\n", 1)[0] and b"body_timeout" in answer, answer[:300]
    assert call(url, "POST", "/v1/embeddings", {"input": "still served"})[0] == 200


def test_a_keep_alive_connection_gets_the_header_timeout_for_each_request(
    bounded: tuple[str, int],
) -> None:
    """Idle between requests is keep-alive's business; a second request's headers are timed."""
    _, port = bounded
    body = b'{"input": "hi"}'
    first = (b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    answer, _ = exchange(
        port, first, pause=2.0, tail=b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in answer, answer[-300:]


def test_request_log_lines_name_the_route_tokens_and_replica() -> None:
    import json as json_module

    proc = Proc("serve", "--port", "0", "--device", "cpu", "--workers", "1", "--log-requests")
    try:
        url = proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
        assert call(url, "POST", "/v1/embeddings", {"input": "a logged request"})[0] == 200
        line = proc.wait_for(r'(\{"request_id".*"route":"/v1/embeddings".*\})', timeout=10).group(1)
        record = json_module.loads(line)
        assert record["status"] == 200 and record["inputs"] == 1 and record["replicas"] == [0]
        assert record["prompt_tokens"] > 0 and "logged" not in line
    finally:
        proc.stop()


def test_a_pipelined_request_gets_the_header_limit_too(bounded: tuple[str, int]) -> None:
    """Bytes sent after a request's body, before its answer, are the next request's headers: an
    oversized one gets 431 after the first answer, and is never read whole into memory."""
    _, port = bounded
    body = b'{"input": "hi"}'
    first = (b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    second = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (4 << 20) + b"\r\n\r\n"
    answer, took = exchange(port, first + second)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b"HTTP/1.1 431" in answer and answer.count(b"HTTP/1.1 ") == 2, answer[-300:]
    assert took < 5.0


@pytest.fixture(scope="module")
def few_slots() -> Iterator[tuple[str, int]]:
    proc = Proc("serve", "--port", "0", "--device", "cpu", "--workers", "1",
                "--max-connections", "16", "--header-timeout", "3")  # fmt: skip
    try:
        url = proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
        port = urlparse(url).port
        assert port is not None
        yield url, port
    finally:
        proc.stop()


def test_idle_connections_never_lock_the_others_out(few_slots: tuple[str, int]) -> None:
    """More connections that send nothing than the worker has slots: each new one takes the
    slot of the oldest idle, so a real client (and `/health`) is still served, with JSON."""
    url, port = few_slots
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
    try:
        time.sleep(0.3)
        start = time.monotonic()
        status, body = call(url, "GET", "/health")
        assert status == 200 and time.monotonic() - start < 1.0, (status, body)
        assert call(url, "POST", "/v1/embeddings", {"input": "still served"})[0] == 200
    finally:
        for s in idle:
            s.close()


def test_over_the_limit_with_every_slot_busy_a_json_503(few_slots: tuple[str, int]) -> None:
    """When every slot holds a request in progress (its body still coming), nothing can be
    evicted: a new connection gets a JSON 503 in OpenAI's shape with retry-after (it was
    uvicorn's text/plain 503), and once they finish the next one is served."""
    url, port = few_slots
    head = (b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            b"\r\nContent-Length: 100\r\n\r\n{")  # fmt: skip
    busy = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(16)]
    try:
        for s in busy:
            s.sendall(head)
        time.sleep(0.5)  # each request's headers read: in progress, not evictable
        answer, took = exchange(port, b"")
        head_part, _, body = answer.partition(b"\r\n\r\n")
        assert head_part.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"content-type: application/json" in head_part.lower()
        assert b"retry-after: 1" in head_part.lower() and took < 1.0
        assert json.loads(body)["error"]["code"] == "too_many_connections"
    finally:
        for s in busy:
            s.close()
    time.sleep(0.3)
    assert call(url, "POST", "/v1/embeddings", {"input": "served again"})[0] == 200


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    few_slots: tuple[str, int],
) -> None:
    _, port = few_slots
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        start = time.monotonic()
        assert s.recv(100) == b""  # closed by the gateway, nothing said
        assert 2.5 < time.monotonic() - start < 5.0


def test_a_blank_line_split_across_two_reads_does_not_count_the_body_as_headers(
    bounded: tuple[str, int],
) -> None:
    """The headers' end arrived in two reads: the 100 KB body after it was counted as header
    bytes, and a valid request got 431."""
    _, port = bounded
    body = json.dumps({"input": "x " * 50_000}).encode()
    head = (b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n" % len(body))  # fmt: skip
    answer, _ = exchange(port, head, pause=0.3, tail=b"\r\n" + body)
    assert answer.startswith(b"HTTP/1.1 "), answer[:100]
    assert not answer.startswith(b"HTTP/1.1 431"), answer[:300]
