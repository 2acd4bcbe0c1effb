"""What running the gateway and the server in one process would save a short query over HTTP: a
prototype against `embedserve serve`, the two called in turn (issue 25, not built).

The prototype (`--prototype PORT`, started by this script) is one process: the bundled MiniLM's
engine built and stepped on an `EngineThread`, the server's `EmbedService` started on the gateway
worker's event loop, and the gateway's one replica calling `service.answer` in process instead of
over the unix socket (its `Replica.open` replaced here: the gateway has no such transport). Each
round both answer `--requests` sequential short queries, one request to each in turn (the first
30 left out). Writes results/studies/one-process-cpuN-YYYYMMDD.json.

    .venv/bin/python benchmarks/studies/one_process.py [--rounds 12]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import corpus, report
from http_ab import http_p50s, start


def prototype(port: int) -> None:
    """Serve the bundled MiniLM from this one process on `port` (0: any), then print the line
    `serve` prints when ready."""
    import socket

    from embedserve import cpu_threads

    cpu_threads.apply_server()  # before torch loads, as a server does
    from grpc_health.v1 import health_pb2

    from embedserve.contract.local import rpc_error
    from embedserve.gateway import main as gateway
    from embedserve.gateway import replicas
    from embedserve.options import EngineOptions
    from embedserve.server.engine_thread import EngineThread
    from embedserve.server.main import ServerConfig, load_engine
    from embedserve.server.service import EmbedService, RequestFailed

    options = EngineOptions(model="minilm")
    engine_thread = EngineThread()
    engine = engine_thread.submit(lambda: load_engine(options)).result()
    seam = engine.seam()
    service = EmbedService(
        seam, ServerConfig(engine=options).scheduler(seam.batch_tokens), batch_wait=0.003
    )
    started: list[bool] = []

    async def embed(request: Any, timeout: float | None = None) -> Any:
        if not started:  # on the worker's loop, at the first call
            started.append(True)
            await service.start(engine_thread)
        try:
            return await service.answer(request)
        except RequestFailed as e:
            raise rpc_error(e.code, str(e)) from None

    async def check(request: Any, timeout: float | None = None) -> Any:
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    def open_in_process(self: Any) -> None:
        self.embed, self.check = embed, check

    async def close(self: Any) -> None:
        pass

    replicas.Replica.open, replicas.Replica.close = open_in_process, close  # type: ignore[method-assign]
    config = gateway.GatewayConfig(models=("minilm",), replicas=("127.0.0.1:1",), port=port)
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    print(f"embedserve: serving minilm at http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    os.setpgrp = lambda: None  # type: ignore[assignment]  # run_worker's; we lead our own session
    gateway.run_worker(config, sock)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--prototype", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prototype is not None:
        return prototype(args.prototype)
    prototype_argv = [sys.executable, __file__, "--prototype", "0"]
    servers = {"serve": start("src", {}), "one process": start("src", {}, prototype_argv)}
    queries = corpus.queries(64)
    p50s: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for r in range(args.rounds):
            for name, p50 in zip(servers, http_p50s([p for _, p in servers.values()], queries,
                                                     args.requests), strict=True):  # fmt: skip
                p50s[name].append(round(p50, 3))
            print(r, {k: v[-1] for k, v in p50s.items()}, flush=True)
    finally:
        for p, _ in servers.values():
            os.killpg(p.pid, signal.SIGTERM)
    saved = [a - b for a, b in zip(p50s["serve"], p50s["one process"], strict=True)]
    doc = {
        "hardware": report.cpu_hardware(), "commit": report.commit(), "date": report.today(),
        "what": "one short query over HTTP, p50 (ms) per round, the two servers called in turn",
        "p50_ms": p50s, "median_ms": {k: statistics.median(v) for k, v in p50s.items()},
        "saved_ms_median": statistics.median(saved),
        "rounds_faster": sum(s > 0 for s in saved), "rounds": args.rounds,
    }  # fmt: skip
    path = report.write_json(f"one-process-cpu{os.cpu_count()}", doc)
    print(doc["median_ms"], "saved (median of rounds)", round(doc["saved_ms_median"], 3),
          f"faster in {doc['rounds_faster']} of {args.rounds}; wrote {path}")  # fmt: skip


if __name__ == "__main__":
    main()
