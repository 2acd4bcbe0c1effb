"""Starting one server process: load the engine, warm it up, serve gRPC until SIGTERM / Ctrl-C.

On a signal the health status turns NOT_SERVING (so gateways route elsewhere), new calls are
refused, and calls already accepted finish (up to `drain_seconds`) before the process exits.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass, field

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from embedserve.contract import SERVICE_NAME, add_embed_service, tracing
from embedserve.contract.local import socket_path
from embedserve.contract.secret import LOOPBACK, LinkSecretInterceptor, read_secret
from embedserve.options import EngineOptions, Options, drain_option, option
from embedserve.processes import say, write_ready
from embedserve.server.local import serve_local
from embedserve.server.scheduler import SchedulerConfig
from embedserve.server.service import EmbedService

log = logging.getLogger("embedserve.server")


@dataclass(frozen=True)
class ServerConfig(Options):
    engine: EngineOptions = field(default_factory=EngineOptions)
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(50051, "gRPC port (0: any free port)")
    max_batch_tokens: int | None = option(
        None,
        "token budget of one engine batch; a larger request runs alone (default: the engine's "
        "largest CUDA-graph bucket, 8192, on a GPU; 2048 on the CPU)",
    )
    max_queued_tokens: int = option(
        SchedulerConfig.max_queued_tokens,
        "refuse new requests (RESOURCE_EXHAUSTED / HTTP 429) beyond this many queued tokens",
    )
    batch_wait_ms: float | None = option(
        None,
        "how long a batch may wait for the clients of the previous batch to come back "
        "(default: 3 on the CPU, 0 on a GPU)",
    )
    metrics_port: int | None = option(
        None,
        "serve the server's Prometheus metrics (graph captures, replays, padding, queue) on "
        "this port; 0 picks a free one; with serve, replica i uses PORT+i (default: off)",
    )
    drain_seconds: float = drain_option()
    link_secret_file: str | None = option(
        None,
        "a file with the secret gateways must send (the same file on the gateway): needed when "
        "--host is not loopback",
        metavar="PATH",
    )
    insecure_link: bool = option(
        False, "serve a non-loopback --host without a link secret (a trusted network only)"
    )
    otlp_endpoint: str | None = option(
        None,
        "export OpenTelemetry spans of each request over OTLP/HTTP (protobuf) to this collector "
        "URL, e.g. http://127.0.0.1:4318 (POSTs to /v1/traces); default: no tracing",
        metavar="URL",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.host not in LOOPBACK and not self.link_secret_file and not self.insecure_link:
            raise ValueError(
                f"--host {self.host} exposes this server's gRPC port beyond this machine: pass "
                "--link-secret-file PATH (and the same to the gateway), or --insecure-link on a "
                "network you trust"
            )
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be in [0, 65535], got {self.metrics_port}")
        if self.batch_wait_ms is not None and self.batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {self.batch_wait_ms}")
        if self.drain_seconds < 0:
            raise ValueError(f"drain_seconds must be >= 0, got {self.drain_seconds}")
        self.scheduler(1)  # validates the budgets

    def scheduler(self, engine_batch_tokens: int) -> SchedulerConfig:
        """The queue's budgets; a batch budget left unset is the engine's own."""
        budget = engine_batch_tokens if self.max_batch_tokens is None else self.max_batch_tokens
        return SchedulerConfig(budget, self.max_queued_tokens)


def load_engine(options: EngineOptions):  # type: ignore[no-untyped-def]
    """The engine for `options.model`, warmed up with one small batch."""
    from embedserve.engine.batch import PackedBatch
    from embedserve.engine.engine import Engine
    from embedserve.loading.bundled import resolve_model

    engine = Engine.from_folder(
        resolve_model(options.model),
        pooling=options.pooling,
        attention=options.attention,
        attention_backend=options.attention_backend,
        device=options.device,
        dtype=options.dtype,
    )
    warm = PackedBatch.from_packed(np.arange(100, 132, dtype=np.int64), np.array([16, 16]))
    engine.step(warm).wait()
    return engine


async def serve(config: ServerConfig) -> None:
    tracing.configure(config.otlp_endpoint, "embedserve-server")
    engine = load_engine(config.engine)
    batch_wait_ms = config.batch_wait_ms
    if batch_wait_ms is None:  # a CPU forward has a fixed cost of milliseconds; a GPU one not
        batch_wait_ms = 3.0 if engine.device.type == "cpu" else 0.0
    service = EmbedService(
        engine,
        config.scheduler(engine.batch_tokens),
        batch_wait=batch_wait_ms / 1000,
        output_rules=engine.spec.output_rules,
        span_pooler=engine.embed_spans,
    )
    secret = read_secret(config.link_secret_file) if config.link_secret_file else None
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 256 << 20),
        ],
        interceptors=[LinkSecretInterceptor(secret)] if secret else None,
    )
    add_embed_service(server, service.embed)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise OSError(f"cannot listen on {config.host}:{config.port}")
    await service.start()
    await server.start()
    # the same calls over a unix socket, for a gateway on this host (`contract.local`)
    local_path = socket_path(port)
    local = await serve_local(local_path, service.answer)
    if config.metrics_port is not None:
        from embedserve.server.metrics import start_metrics_server

        metrics_port = start_metrics_server(config.host, config.metrics_port, engine, service)
        say(
            f"embedserve server: metrics on http://{config.host}:{metrics_port}/metrics",
        )
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    what = (
        f"{engine.output_width} dims"
        if engine.spec.score is None
        else f"scores pairs ({engine.spec.score.kind})"
    )
    say(
        f"embedserve server: ready on {config.host}:{port} "
        f"({config.engine.model}, {engine.device}, {what}, "
        f"{engine.spec.attention} attention, {engine.spec.pooling} pooling, "
        f"batch tokens {service.scheduler.config.max_batch_tokens}, local socket {local_path})",
    )
    write_ready(
        {
            "address": f"{config.host}:{port}",
            "max_batch_tokens": service.scheduler.config.max_batch_tokens,
            "local_socket": str(local_path),
        }
    )
    await stop.wait()
    say("embedserve server: draining")
    await health_servicer.enter_graceful_shutdown()
    await asyncio.gather(
        server.stop(grace=config.drain_seconds), local.stop(grace=config.drain_seconds)
    )
    await service.stop()
    if tracing.TRACER is not None:
        tracing.TRACER.shutdown()  # the last spans exported
    say("embedserve server: stopped")


def run(config: ServerConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(run(ServerConfig(EngineOptions(model=sys.argv[1] if len(sys.argv) > 1 else "minilm"))))
