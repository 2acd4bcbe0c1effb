"""Hostile requests one at a time against a real `embedserve serve`, with a probe client beside
each: per case, its answer's status and time, the gateway's resident memory after it, and the
probe's p50 / p99 and errors while it ran (issue 40). `hostile.py --cases` runs them.

Each case is the attack of one defect that issue 40 fixed (or that held before), built the way
an attacker would send it: raw bytes on a socket where the HTTP client would refuse them.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import secrets
import select
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.machine import rss_mb

TEXT_14MB = ("lorem ipsum dolor sit amet " * 600_000)[:14_000_000]
Case = Callable[[int], int]  # port -> the status of the hostile request


def _post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
        reply = conn.getresponse()
        reply.read()
        return reply.status
    finally:
        conn.close()


def _json(port: int, path: str, value: Any) -> int:
    return _post(port, path, json.dumps(value).encode())


def idle_connections(port: int) -> int:
    """1,100 connections that send nothing (over --max-connections), then one real request."""
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(1100)]
    try:
        time.sleep(1.0)
        return _json(port, "/v1/embeddings", {"input": "a real client"})
    finally:
        for s in idle:
            s.close()


def _bodies(item: bytes) -> bytes:
    return b'{"input": [' + b",".join([item] * (16_000_000 // (len(item) + 1))) + b"]}"


def _sends(path: str, body: Any, headers: dict[str, str] | None = None) -> Case:
    """The case's request, its body built now (outside the time measured)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return lambda port: _post(port, path, data, headers)


# each case's request, built when the suite starts (its bytes made before its clock starts)
CASES: dict[str, Callable[[], Case]] = {
    "1,100 idle connections, then a request": lambda: idle_connections,
    'truncate "chunk", a 14 MB text': lambda: _sends(
        "/v1/embeddings", {"input": TEXT_14MB, "truncate": "chunk"}
    ),
    "contextualized, a 14 MB chunk": lambda: _sends(
        "/v1/contextualizedembeddings", {"input": [[TEXT_14MB]]}
    ),
    'a 14 MB hex blob, truncate "end"': lambda: _sends(
        "/v1/embeddings", {"input": secrets.token_hex(7_000_000), "truncate": "end"}
    ),
    "16 MB of []": lambda: _sends("/v1/embeddings", _bodies(b"[]")),
    "16 MB of {}": lambda: _sends("/v1/embeddings", _bodies(b"{}")),
    "input nested 1,000 deep": lambda: _sends(
        "/v1/embeddings", b'{"input": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    ),
    "rerank: a 1 MB query, 2,048 documents": lambda: _sends(
        "/v1/rerank", {"query": "what is it " * 100_000, "documents": ["a doc"] * 2048}
    ),
    "embed_all: 2,048 texts of 256 tokens": lambda: _sends(
        "/embed_all", {"inputs": ["word " * 300] * 2048, "truncate": True}
    ),
    "a Content-Length of 17 MB (over the limit)": lambda: _over_length,
    "a chunked body past 16 MiB": lambda: _over_chunked,
    "two Host headers": lambda: _two_hosts,
    "gzip Content-Encoding": lambda: _sends(
        "/v1/embeddings", b"\x1f\x8b\x08\x00garbage", {"Content-Encoding": "gzip"}
    ),
}


def _status(s: socket.socket) -> int:
    return int(s.recv(100).split(b" ")[1])


def _over_length(port: int) -> int:
    """A Content-Length of 17 MB (over the 16 MiB limit), the body's first 64 KB sent, then the
    answer read: refused from the headers, nothing more awaited."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 17000000\r\n\r\n" + b"x" * 65536
        )
        return _status(s)


def _over_chunked(port: int) -> int:
    """A chunked body sent 1 MB at a time until the answer comes (over 16 MiB: a 413 once the
    count passes the limit)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"%x\r\n" % 2**20 + b"x" * 2**20 + b"\r\n"
        s.setblocking(False)
        for _ in range(64):  # 64 MB at most
            # the server stopped reading: its answer is there
            with contextlib.suppress(BlockingIOError, BrokenPipeError, ConnectionResetError):
                s.sendall(chunk)
            ready, _, _ = select.select([s], [], [], 0.001)
            if ready:
                break
        s.setblocking(True)
        return _status(s)


def _two_hosts(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n")
        return _status(s)


class Probe:
    """One client sending a short query after another on a keep-alive connection; the latency
    and status of each, with the time it was sent."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.samples: list[tuple[float, float, int]] = []  # (sent, ms, status)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        body = json.dumps({"input": "a short probe query"})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
                reply = conn.getresponse()
                reply.read()
                status = reply.status
            except (OSError, http.client.HTTPException):
                status = 0
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            self.samples.append((t0, (time.monotonic() - t0) * 1e3, status))
            time.sleep(0.01)

    def window(self, start: float, end: float) -> dict[str, Any]:
        inside = [(ms, status) for t, ms, status in self.samples if start <= t <= end]
        ms = sorted(m for m, _ in inside)
        if not ms:
            return {"requests": 0}
        return {
            "requests": len(ms),
            "p50_ms": round(statistics.median(ms), 1),
            "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1),
            "max_ms": round(ms[-1], 1),
            "errors": sum(1 for _, status in inside if status != 200),
        }

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)


def run_cases(port: int, gateway: Callable[[], set[int]]) -> dict[str, Any]:
    """Every case in turn, the probe running throughout; `gateway()`: its processes now."""
    probe = Probe(port)
    time.sleep(3.0)  # the probe's idle latency
    idle = probe.window(0, time.monotonic())
    rss_before = rss_mb(gateway())
    out: dict[str, Any] = {"probe idle": idle, "gateway RSS MB before": round(rss_before, 1)}
    for name, build in CASES.items():
        case = build()
        start = time.monotonic()
        try:
            status = case(port)
        except OSError as e:
            status = f"{type(e).__name__}: {e}"  # type: ignore[assignment]
        took = time.monotonic() - start
        time.sleep(1.0)  # the probe after it, too
        out[name] = {
            "status": status,
            "seconds to the answer": round(took, 3),
            "gateway RSS MB after": round(rss_mb(gateway()), 1),
            "probe": probe.window(start, time.monotonic()),
        }
    probe.close()
    out["gateway RSS MB after all (vs before)"] = round(rss_mb(gateway()) - rss_before, 1)
    return out
