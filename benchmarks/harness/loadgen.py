"""A load generator of several processes, and a no-op HTTP server to show it is not the limit.

One Python process tops out near 4,700 requests/s of client work on the H200 host, below the
concurrency target (6,000): each client here is a process of its own with one keep-alive
connection, sending its requests back to back (closed loop). The clients start together at a
shared instant, stop together, and send back their latencies and the `prompt_tokens` of the
replies (read from the reply's tail, not a full JSON parse: client CPU is what this saves).

`noop_server(workers)` is the ceiling: a raw ASGI app under uvicorn answering a fixed
embeddings body from `workers` processes on one port. A result is trustworthy when the same
clients against it reach well above (at least 1.5x) the rate they are asked to show.

    PYTHONPATH=src python3 benchmarks/studies/loadgen_ceiling.py --clients 16 --workers 8
"""

from __future__ import annotations

import contextlib
import http.client
import json
import multiprocessing as mp
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .timing import percentile

TOKENS = re.compile(rb'"prompt_tokens":\s*(\d+)')


@dataclass
class LoadResult:
    latencies: list[float]  # seconds, every request of every client
    seconds: float  # the measured window
    tokens: int  # sum of the replies' prompt_tokens
    errors: int

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies) / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def summary(self) -> dict[str, float]:
        ms = [x * 1000 for x in self.latencies] or [0.0]
        return {
            "requests_per_s": self.requests_per_s,
            "tokens_per_s": self.tokens_per_s,
            "p50_ms": percentile(ms, 50),
            "p99_ms": percentile(ms, 99),
            "requests": float(len(self.latencies)),
            "errors": float(self.errors),
        }


def _client(port: int, path: str, bodies: list[bytes], pipe: Any) -> None:
    """Connect, say so on `pipe`, then send from the (start, stop) instants it answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    latencies, tokens, errors, i = [], 0, 0, 0
    conn.request("POST", path, body=bodies[0], headers=headers)  # connect before the start
    conn.getresponse().read()
    pipe.send("ready")
    start_at, stop_at = pipe.recv()
    time.sleep(max(0.0, start_at - time.time()))
    while time.time() < stop_at:
        t0 = time.perf_counter()
        conn.request("POST", path, body=bodies[i % len(bodies)], headers=headers)
        reply = conn.getresponse()
        data = reply.read()
        latencies.append(time.perf_counter() - t0)
        if reply.status != 200:
            errors += 1
        elif m := TOKENS.search(data, max(0, len(data) - 200)):
            tokens += int(m.group(1))
        i += 1
    conn.close()
    pipe.send((latencies, tokens, errors))


def _start_clients(
    port: int, path: str, bodies: list[list[bytes]], seconds: float
) -> tuple[list[Any], list[Any]]:
    """One client process per entry of `bodies`; once every one has connected (a spawned
    process takes a second or more to start on a busy 2-core machine), one shared start 0.2 s
    later: their pipes and processes."""
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for mine in bodies:
        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=_client, args=(port, path, mine, theirs))
        p.start()
        pipes.append(ours)
        procs.append(p)
    for pipe in pipes:
        if pipe.recv() != "ready":
            raise RuntimeError("a load client did not connect")
    start_at = time.time() + 0.2
    for pipe in pipes:
        pipe.send((start_at, start_at + seconds))
    return pipes, procs


def run(
    port: int,
    bodies: list[list[bytes]],
    seconds: float,
    path: str = "/v1/embeddings",
) -> LoadResult:
    """One client process per entry of `bodies` (its own request bodies, sent in turn), all
    sending for `seconds` from one shared start."""
    pipes, procs = _start_clients(port, path, bodies, seconds)
    latencies: list[float] = []
    tokens = errors = 0
    for receive in pipes:
        lat, tok, err = receive.recv()
        latencies += lat
        tokens += tok
        errors += err
    for p in procs:
        p.join()
    return LoadResult(latencies, seconds, tokens, errors)


def split(bodies: list[bytes], clients: int) -> list[list[bytes]]:
    """Each client's share of the bodies (round robin), so clients do not send in lockstep."""
    return [bodies[k::clients] or bodies for k in range(clients)]


def _noop_worker(fd: int, body: bytes) -> None:
    import uvicorn

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    sock = socket.socket(fileno=fd)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


@contextlib.contextmanager
def noop_server(workers: int, dims: int = 384) -> Iterator[int]:
    """A no-op embeddings server of `workers` processes on one port; yields the port."""
    body = json.dumps(
        {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.05] * dims}],
            "model": "noop",
            "usage": {"prompt_tokens": 8, "total_tokens": 8},
        }
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.set_inheritable(True)
    ctx = mp.get_context("fork")  # the workers inherit the listening socket
    procs = [ctx.Process(target=_noop_worker, args=(sock.fileno(), body)) for _ in range(workers)]
    for p in procs:
        p.start()
    port = sock.getsockname()[1]
    try:
        deadline = time.time() + 30
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("POST", "/v1/embeddings", body=b"{}")
                conn.getresponse().read()
                conn.close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        yield port
    finally:
        for p in procs:
            if p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            p.join(10)
        sock.close()


@dataclass
class Load:
    """One load: every client's latencies (s), in order, and the measured window (s)."""

    clients: list[list[float]]
    seconds: float
    errors: int

    def rates(self) -> tuple[float, float]:
        """Requests/s two ways: requests started in the window / window (loadgen's), and clients /
        mean latency (Little's law for a closed loop: free of the window's edges where a request
        takes seconds and only a few fit in the window)."""
        n = sum(len(c) for c in self.clients)
        total = sum(sum(c) for c in self.clients)
        return n / self.seconds, len(self.clients) * n / total if total else 0.0


def run_load(
    port: int, bodies: list[list[bytes]], seconds: float, first: bytes | None = None
) -> Load:
    """`run`, keeping each client's latencies apart.

    With `first` (a cheap body), each client's bodies are `first` and then its share repeated
    past what the window can take: loadgen's client sends its first body once to connect (before
    the start, untimed) and once more as its first timed request, whose latency is dropped here.
    So heavy requests neither delay the start nor count twice."""
    sent = [
        [first, *mine * (1 + 200 // len(mine))] if first is not None else mine for mine in bodies
    ]
    pipes, procs = _start_clients(port, "/v1/embeddings", sent, seconds)
    clients: list[list[float]] = []
    errors = 0
    for receive in pipes:
        lat, _, err = receive.recv()
        clients.append(lat[1:] if first is not None else lat)
        errors += err
    for p in procs:
        p.join()
    return Load(clients, seconds, errors)


def summarize_loads(runs: list[Load], little: bool) -> dict[str, Any]:
    """Requests/s over all rounds together (window or Little's law, see Load.rates),
    percentiles over all their requests."""
    ms = [x * 1000 for r in runs for c in r.clients for x in c]
    rates = [r.rates() for r in runs]
    window = sum(len(c) for r in runs for c in r.clients) / sum(r.seconds for r in runs)
    little_ = sum(x[1] for x in rates) / len(rates) if rates else float("nan")
    return {
        "requests_per_s": little_ if little else window,
        "requests_per_s_window": window,
        "requests_per_s_little": little_,
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "requests": int(sum(len(c) for r in runs for c in r.clients)),
        "errors": sum(r.errors for r in runs),
        "rounds_requests_per_s": [round(x[1] if little else x[0], 2) for x in rates],
        # how much of the window each client spent waiting on replies (about 1: busy throughout)
        "busy": round(
            min(sum(c) / r.seconds for r in runs for c in r.clients) if len(ms) > 1 else 0.0,
            3,
        ),
    }
