"""A server killed behind a running gateway: fast 503s, then `/ready` again once it restarts."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.e2e.conftest import Proc, free_port

pytestmark = pytest.mark.slow


def call(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    status, reply, _ = call_with_headers(url, method, path, body)
    return status, reply


def call_with_headers(
    url: str, method: str, path: str, body: Any = None
) -> tuple[int, Any, dict[str, str]]:
    parts = urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read()), dict(reply.getheaders())
    finally:
        conn.close()


def start_server(port: int) -> Proc:
    proc = Proc(
        "server",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--port",
        str(port),
        "--drain-seconds",
        "5",
    )
    proc.wait_for(r"embedserve server: ready on")
    return proc


@pytest.fixture
def split_stack() -> Iterator[tuple[list[Proc], str]]:
    """A server and a gateway started apart; the list lets the test swap the server."""
    port = free_port()
    procs = [start_server(port)]
    gateway = Proc(
        "gateway", "--replica", f"127.0.0.1:{port}", "--port", "0", "--request-timeout", "10"
    )
    try:
        url = gateway.wait_for(r"embedserve gateway: listening on (\S+)").group(1)
        yield procs, url
    finally:
        gateway.stop()
        for p in procs:
            p.stop()


def wait_ready(url: str, want: int, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if call(url, "GET", "/ready")[0] == want:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"/ready did not become {want} within {timeout}s")


def test_killed_server_gives_fast_503s_and_a_restart_brings_ready_back(
    split_stack: tuple[list[Proc], str],
) -> None:
    procs, url = split_stack
    body = {"input": ["still there?"]}
    assert call(url, "GET", "/ready")[0] == 200
    assert call(url, "POST", "/v1/embeddings", body)[0] == 200

    procs[0].kill()  # SIGKILL: no drain, no goodbye
    for _ in range(5):
        start = time.monotonic()
        status, reply = call(url, "POST", "/v1/embeddings", body)
        assert status == 503, reply
        assert reply["error"]["type"] == "service_unavailable"
        assert time.monotonic() - start < 2.0  # an answer, not a hang
    wait_ready(url, 503, timeout=5)
    assert call(url, "GET", "/health")[0] == 200  # the gateway itself is alive

    # /ready names replicas by index, not address: the port is the one the fixture chose
    assert call(url, "GET", "/ready")[1]["replicas"][0]["replica"] == 0
    assert "127.0.0.1" not in json.dumps(reply)  # no internal address in the 503 either
    port = procs[0].argv[procs[0].argv.index("--port") + 1]
    procs.append(start_server(int(port)))
    wait_ready(url, 200, timeout=10)
    status, reply = call(url, "POST", "/v1/embeddings", body)
    assert status == 200, reply
    assert len(reply["data"][0]["embedding"]) == 384


def test_sigterm_drains_in_flight_requests(split_stack: tuple[list[Proc], str]) -> None:
    import threading

    procs, url = split_stack
    results: list[int] = []
    # one chunk of distinct texts (identical ones are embedded once: issue 56)
    big = {"input": [f"{i} " + "a somewhat longer sentence to embed " * 6 for i in range(150)]}
    worker = threading.Thread(
        target=lambda: results.append(call(url, "POST", "/v1/embeddings", big)[0])
    )
    worker.start()
    deadline = time.monotonic() + 20
    while call(url, "GET", "/ready")[1]["replicas"][0]["outstanding_tokens"] == 0:
        assert time.monotonic() < deadline, "the request never reached the server"
        time.sleep(0.01)
    time.sleep(0.2)  # sent by the gateway: now surely in the server, which needs seconds for it
    # the request is in the server now: it must finish although the server is told to stop
    procs[0].signal(signal.SIGTERM)
    worker.join(30)
    assert results == [200]
    assert procs[0].proc.wait(15) == 0


def test_two_replicas_share_the_load_and_a_dead_one_is_retried_around() -> None:
    ports = [free_port(), free_port()]
    servers = [start_server(p) for p in ports]
    replicas = [arg for p in ports for arg in ("--replica", f"127.0.0.1:{p}")]
    gateway = Proc("gateway", *replicas, "--port", "0", "--chunk-tokens", "64")
    try:
        url = gateway.wait_for(r"embedserve gateway: listening on (\S+)").group(1)
        ready = call(url, "GET", "/ready")[1]
        assert [r["healthy"] for r in ready["replicas"]] == [True, True]
        texts = [f"sentence number {i} about replicas" for i in range(40)]
        status, both = call(url, "POST", "/v1/embeddings", {"input": texts})
        assert status == 200, both
        servers[0].kill()
        # At once, before the health poll notices: calls to the dead one are retried on the other.
        status, one = call(url, "POST", "/v1/embeddings", {"input": texts})
        assert status == 200, one
        for a, b in zip(both["data"], one["data"], strict=True):
            assert a["index"] == b["index"]
            assert (
                max(abs(x - y) for x, y in zip(a["embedding"], b["embedding"], strict=True)) < 1e-5
            )
    finally:
        gateway.stop()
        for s in servers:
            s.stop()


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def test_serve_restarts_a_crashed_server_and_ready_comes_back() -> None:
    serve = Proc("serve", "--no-native", "--port", "0", "--device", "cpu", "--dtype", "float32")
    try:
        url = serve.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
        assert call(url, "POST", "/v1/embeddings", {"input": "before"})[0] == 200
        [server] = [p for p in children_of(serve.proc.pid) if " server " in cmdline(p)]
        mark = len(serve.lines)
        os.kill(server, signal.SIGKILL)
        wait_ready(url, 503, timeout=5)
        assert call(url, "POST", "/v1/embeddings", {"input": "during"})[0] == 503
        serve.wait_for(r"server-0 exited .*; restarting", timeout=10, start=mark)
        wait_ready(url, 200, timeout=60)
        status, reply = call(url, "POST", "/v1/embeddings", {"input": "after"})
        assert status == 200, reply
        assert serve.proc.poll() is None
    finally:
        assert serve.stop() == 0


def test_an_overloaded_server_gives_429_and_keeps_serving() -> None:
    import concurrent.futures

    port = free_port()
    server = Proc(
        "server",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--port",
        str(port),
        "--max-queued-tokens",
        "1000",
    )
    server.wait_for(r"embedserve server: ready on")
    # NOTE: parts of at most 1,000 tokens make each ~620-token request a large call of its own,
    # sent at once and apart. With the default 8,192, requests arriving in one loop turn merged
    # into one server call, which an empty queue always takes: CI once saw twelve 200s.
    gateway = Proc(
        "gateway", "--replica", f"127.0.0.1:{port}", "--port", "0", "--part-tokens", "1000"
    )
    try:
        url = gateway.wait_for(r"embedserve gateway: listening on (\S+)").group(1)
        # ~620 tokens of twelve distinct texts (identical ones are embedded once: issue 56)
        body = {"input": [f"{i} " + "a sentence of some length to fill the queue " * 5
                          for i in range(12)]}  # fmt: skip
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            replies = list(
                pool.map(
                    lambda _: call_with_headers(url, "POST", "/v1/embeddings", body), range(12)
                )
            )
        statuses = sorted(status for status, _, _ in replies)
        assert 200 in statuses and 429 in statuses, statuses
        assert set(statuses) == {200, 429}
        for status, reply, headers in replies:
            if status == 429:
                assert headers["retry-after"] == "1"
                assert reply["error"]["type"] == "rate_limit_error"
                assert reply["error"]["code"] == "overloaded"
            else:
                assert len(reply["data"]) == 12
        assert call(url, "POST", "/v1/embeddings", {"input": "after"})[0] == 200
    finally:
        gateway.stop()
        server.stop()
