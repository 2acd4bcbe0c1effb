"""The gateway under hostile clients, on the CPU, one script run (`embedserve serve`, defaults):

1. p50/p99 of one short query per request from 4 client processes, idle, then while 200 more
   connections trickle header bytes (one every second, never finishing) — and whether the
   header timeout closed those 200;
2. one request whose header is 100 MB: the time to its 431, and the gateway's resident memory
   (all its processes) before and after;
3. SIGTERM with a request in flight: the time a new request takes to get its 503, that the one
   in flight still gets 200, and the time to exit;
4. `kill -9` of `serve`: the time until none of its processes remains and its port is free.

`--cases`: instead, each hostile request of `hostile_cases` in turn against a fresh `serve`,
with a probe client beside it (status, time, gateway RSS, the probe's p99 per case).

    PYTHONPATH=src python3 benchmarks/studies/hostile.py [--trickle 200] [--seconds 30] [--cases]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
sys.path.insert(0, str(Path(__file__).resolve().parent))  # hostile_cases
import contextlib

from harness import corpus, loadgen, report
from harness.http_calls import post_status as post
from harness.machine import rss_mb
from harness.servers import CLI, start

from embedserve.processes import alive, descendants


def gateway_pids(serve_pid: int) -> set[int]:
    out = set()
    for pid in descendants(serve_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"gateway" in cmd or b"multiprocessing" in cmd:
            out.add(pid)
    return out


def trickle(port: int, count: int, stop: threading.Event, closed: list[int]) -> None:
    """`count` connections that send one header byte a second, never finishing their headers."""
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        socks.append(s)
    open_ = set(range(count))
    while not stop.is_set() and open_:
        time.sleep(1)
        for i in list(open_):
            try:
                socks[i].sendall(b"a")
            except OSError:
                open_.discard(i)
    for i in list(open_):  # a closed socket reads EOF (after the 408)
        socks[i].setblocking(False)
        try:
            if socks[i].recv(65536) == b"":
                open_.discard(i)
        except (BlockingIOError, OSError):
            pass
    closed.append(count - len(open_))
    for s in socks:
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trickle", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    ap.add_argument("--cases", action="store_true", help="the hostile requests of issue 40")
    args = ap.parse_args()
    if args.cases:
        return cases(args)
    results: dict[str, Any] = {}
    bodies = [json.dumps({"input": q}).encode() for q in corpus.queries(64)]

    server, ready = start([*CLI, "serve", "--device", "cpu", "--port", "0"],
                          r"serving \S+ at (http://127\.0\.0\.1:(\d+))")  # fmt: skip
    port = int(ready.group(2))
    try:
        trickling(port, bodies, args, results)
        big_header(port, server.proc.pid, results)
        sigterm(port, server, results)
    finally:
        server.stop(30)
    results["kill -9 of serve"] = kill_9()
    doc = {"hardware": report.cpu_hardware(), "commit": report.commit(),
           "date": time.strftime("%Y-%m-%d"), "results": results}  # fmt: skip
    report.write_json("hostile-cpu", doc, args.out)
    print(json.dumps(doc, indent=1))


def cases(args: argparse.Namespace) -> None:
    """Each hostile request of `hostile_cases` with a probe client beside it."""
    from hostile_cases import run_cases

    server, ready = start([*CLI, "serve", "--device", "cpu", "--port", "0"],
                          r"serving \S+ at (http://127\.0\.0\.1:(\d+))")  # fmt: skip
    port = int(ready.group(2))
    load = Path("/proc/loadavg").read_text().split()[:3]
    try:
        results = run_cases(port, lambda: gateway_pids(server.proc.pid))
    finally:
        server.stop(30)
    doc = {"hardware": report.cpu_hardware(), "commit": report.commit(),
           "date": time.strftime("%Y-%m-%d"), "load average at start": load,
           "note": "a shared 2-core machine (other agents' jobs ran too)",
           "results": results}  # fmt: skip
    path = report.write_json("hostile-cases-cpu", doc, args.out)
    print(json.dumps(doc, indent=1))
    print(path)


def trickling(port: int, bodies: list[bytes], args: argparse.Namespace, results: dict[str, Any]) -> None:  # fmt: skip
    """1. query latency idle, then while connections trickle header bytes."""
    loadgen.run(port, loadgen.split(bodies, 4), 2.0)
    idle = loadgen.run(port, loadgen.split(bodies, 4), 10.0).summary()
    stop, closed = threading.Event(), []
    thread = threading.Thread(target=trickle, args=(port, args.trickle, stop, closed))
    thread.start()
    time.sleep(2)
    loaded = loadgen.run(port, loadgen.split(bodies, 4), args.seconds - 4).summary()
    time.sleep(2)
    stop.set()
    thread.join(60)
    results["idle"] = {k: round(idle[k], 2) for k in ("requests_per_s", "p50_ms", "p99_ms")}
    results[f"with {args.trickle} trickling connections"] = {
        k: round(loaded[k], 2) for k in ("requests_per_s", "p50_ms", "p99_ms")
    }
    results["trickling connections closed by the header timeout"] = closed[0] if closed else None
    results["p99 ratio (trickling / idle)"] = round(loaded["p99_ms"] / idle["p99_ms"], 2)


def big_header(port: int, serve_pid: int, results: dict[str, Any]) -> None:
    """2. one request whose header is 100 MB: its answer and the gateway's memory."""
    gateway = gateway_pids(serve_pid)
    before = rss_mb(gateway)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        t0 = time.monotonic()
        answer = b""
        try:
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
            chunk = b"a" * (1 << 20)
            for _ in range(100):
                s.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            answer = s.recv(200)
        took = time.monotonic() - t0
    time.sleep(1)
    results["100 MB header"] = {
        "status line": answer.split(b"\r\n", 1)[0].decode(errors="replace"),
        "seconds to the answer": round(took, 3),
        "gateway RSS MB before / after": [round(before, 1), round(rss_mb(gateway), 1)],
    }


def sigterm(port: int, server: Any, results: dict[str, Any]) -> None:
    """3. SIGTERM with a request in flight: a new request's 503, the one in flight's 200."""

    big = {"input": ["a somewhat longer sentence to embed " * 6] * 300}
    statuses: list[int] = []
    inflight = threading.Thread(target=lambda: statuses.append(post(port, big)))
    inflight.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    server.signal(signal.SIGTERM)
    time.sleep(0.05)
    t1 = time.monotonic()
    status = post(port, {"input": "new"}, timeout=10)
    new_ms = (time.monotonic() - t1) * 1e3
    inflight.join(120)
    code = server.proc.wait(60)
    results["SIGTERM"] = {
        "new request status": status,
        "new request ms": round(new_ms, 1),
        "request in flight status": statuses[0] if statuses else None,
        "seconds to exit": round(time.monotonic() - t0, 2),
        "exit code": code,
    }


def kill_9() -> dict[str, Any]:
    """4. `kill -9` of `serve`: the time until none of its processes remains and its port is free."""
    server, ready = start([*CLI, "serve", "--device", "cpu", "--port", "0"],
                          r"serving \S+ at (http://127\.0\.0\.1:(\d+))")  # fmt: skip
    port = int(ready.group(2))
    below = descendants(server.proc.pid)
    t0 = time.monotonic()
    os.kill(server.proc.pid, signal.SIGKILL)
    while time.monotonic() - t0 < 30:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                free = True
            except OSError:
                free = False
        if free and not any(map(alive, below)):
            break
        time.sleep(0.05)
    return {
        "processes below it": len(below),
        "seconds until none remains and the port is free": round(time.monotonic() - t0, 2),
        "left": [p for p in below if alive(p)],
    }


if __name__ == "__main__":
    main()
