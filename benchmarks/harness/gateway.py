"""The gateway's cost without a model: a real gRPC server whose engine answers at once, and the
two ways the benchmarks time a request through the gateway (in process, and over loopback)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np

from .http_calls import connect, post_on


def noop_server() -> None:
    """A real gRPC server whose engine returns zeros at once: measures everything but the model.
    Prints `noop server: ready on HOST:PORT` (started through `servers.harness_call`)."""
    import grpc

    from embedserve.contract import add_embed_service
    from embedserve.engine.seam import EngineSeam
    from embedserve.server.handles import Ready
    from embedserve.server.scheduler import SchedulerConfig
    from embedserve.server.service import EmbedService

    class NoopEngine:
        output_width = 384

        def check(self, batch: Any) -> None:
            pass

        def step(self, batch: Any) -> Ready:
            return Ready(np.full((batch.num_seqs, 384), 0.05, dtype=np.float32))

    async def main() -> None:
        noop, config = NoopEngine(), SchedulerConfig()
        seam = EngineSeam(noop.step, noop.check, noop.output_width, config.max_batch_tokens)
        service = EmbedService(seam, config)
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


def sequential_us(
    port: int, texts: list[Any], count: int, fields: dict[str, Any] | None = None
) -> list[float]:
    """`count` requests one after another on one keep-alive connection, µs each; `fields`:
    more of each body (`truncate`)."""
    conn = connect(port, timeout=60)
    bodies = [json.dumps({"input": t, **(fields or {})}).encode() for t in texts]
    out = []
    for i in range(count):
        t0 = time.perf_counter()
        post_on(conn, bodies[i % len(bodies)])
        out.append((time.perf_counter() - t0) * 1e6)
    conn.close()
    return out


def interleaved_us(
    ports: list[int], texts: list[Any], count: int, fields: dict[str, Any] | None = None
) -> list[list[float]]:
    """`sequential_us` on several servers at once, one request to each in turn (the order rotated
    every turn), so that a machine whose speed drifts by the second slows them alike: per
    server, `count` times in µs."""
    conns = [connect(port, timeout=60) for port in ports]
    bodies = [json.dumps({"input": t, **(fields or {})}).encode() for t in texts]
    out: list[list[float]] = [[] for _ in ports]
    for i in range(count):
        for k in range(len(ports)):
            j = (i + k) % len(ports)
            t0 = time.perf_counter()
            post_on(conns[j], bodies[i % len(bodies)])
            out[j].append((time.perf_counter() - t0) * 1e6)
    for conn in conns:
        conn.close()
    return out


def asgi_overhead_us(texts: list[str], count: int, model: str = "minilm") -> list[float]:
    """The gateway app in process; the replica call answered at once with a prebuilt response."""
    from embedserve.contract import EmbedResponse
    from embedserve.gateway.main import GatewayConfig, build_app

    app = build_app(GatewayConfig(replicas=("127.0.0.1:1",), models=(model,)))
    row = np.full((1, 384), 0.05, dtype="<f4")
    response = EmbedResponse(embeddings=row.tobytes(), shape=[1, 384], dtype="float32")

    class InstantPool:
        replicas: tuple[Any, ...] = ()

        async def embed(self, request: Any, num_tokens: int) -> Any:
            return response

    bodies = [json.dumps({"input": t}).encode() for t in texts]
    return asyncio.run(_asgi_calls(app, InstantPool(), bodies, count))


async def _asgi_calls(app: Any, pool: Any, bodies: list[bytes], count: int) -> list[float]:
    served = app.served.models[0]
    pipeline = served.make_pipeline()  # in the loop, as the app's startup makes it
    pipeline.replicas = pool
    served.pipeline = pipeline
    # NOTE: the Host a loopback client sends: the gateway answers 421 to a request without one
    # it serves (--allowed-host), so a scope without it measured an error reply
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": headers}
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    out = []
    for i in range(count):
        messages = [{"type": "http.request", "body": bodies[i % len(bodies)], "more_body": False}]

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
