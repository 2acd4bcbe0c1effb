"""`embedserve serve` stopping: SIGTERM drains (new requests 503 at once, in-flight ones finish),
and `kill -9` of the top process leaves no process of it and a free port."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from urllib.parse import urlparse

import pytest

from embedserve.processes import alive, descendants
from tests.e2e.conftest import Proc
from tests.e2e.test_replica_failure import call, call_with_headers

pytestmark = pytest.mark.slow


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_sigterm_answers_new_requests_503_at_once_while_in_flight_ones_finish() -> None:
    proc = Proc("serve", "--port", "0", "--device", "cpu", "--workers", "1")
    url = proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
    try:
        results: list[int] = []
        # distinct texts: identical ones are embedded once (issue 56), and 300 copies of one
        # were done before the signal came, the worker gone before the new request's 503
        big = {"input": [f"{i} " + "a somewhat longer sentence to embed " * 6 for i in range(300)]}
        worker = threading.Thread(
            target=lambda: results.append(call(url, "POST", "/v1/embeddings", big)[0])
        )
        worker.start()
        deadline = time.monotonic() + 20
        while call(url, "GET", "/ready")[1]["replicas"][0]["outstanding_tokens"] == 0:
            assert time.monotonic() < deadline, "the request never reached the server"
            time.sleep(0.01)
        proc.signal(signal.SIGTERM)
        # NOTE: natively (`serve`'s default) the signal reaches the drain through the launcher
        # and the native process's signal check, which needs the GIL: usually within 50 ms, but
        # once past it under the full suite's load (2 cores). Bounded here, then timed as before.
        deadline = time.monotonic() + 2.0
        time.sleep(0.05)
        while call(url, "GET", "/ready")[0] != 503:
            assert time.monotonic() < deadline, "not draining 2 s after SIGTERM"
            time.sleep(0.01)
        start = time.monotonic()
        status, body, headers = call_with_headers(url, "POST", "/v1/embeddings", {"input": "hi"})
        took = time.monotonic() - start
        assert status == 503 and body["error"]["code"] == "shutting_down", body
        assert headers.get("retry-after") == "1" and took < 0.1, (headers, took)
        worker.join(60)
        assert results == [200]  # the request in flight finished
        assert proc.proc.wait(30) == 0
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("flags", "processes"),
    # a server, the gateway supervisor and its two workers; the native process
    [(("--no-native", "--workers", "2"), 4), (("--native",), 1)],
    ids=["python", "native"],
)
def test_kill_9_of_serve_leaves_no_process_and_frees_the_port(
    flags: tuple[str, ...], processes: int
) -> None:
    proc = Proc("serve", "--port", "0", "--device", "cpu", *flags)
    url = proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
    port = urlparse(url).port
    assert port is not None
    assert call(url, "POST", "/v1/embeddings", {"input": "warm"})[0] == 200
    below = descendants(proc.proc.pid)
    assert len(below) >= processes, below
    os.kill(proc.proc.pid, signal.SIGKILL)
    proc.proc.wait(5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (any(map(alive, below)) or not port_is_free(port)):
        time.sleep(0.05)
    left = [p for p in below if alive(p)]
    assert not left, f"still running after 5 s: {left}"
    assert port_is_free(port)
