"""Starting one server process: load the engine, warm it up, serve gRPC until SIGTERM / Ctrl-C.

On a signal the health status turns NOT_SERVING (so gateways route elsewhere), new calls are
refused, and calls already accepted finish (up to `drain_seconds`) before the process exits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import sys
from dataclasses import dataclass

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from embedserve.contract import SERVICE_NAME, add_embed_service
from embedserve.server.scheduler import SchedulerConfig
from embedserve.server.service import EmbedService

log = logging.getLogger("embedserve.server")


@dataclass(frozen=True)
class ServerConfig:
    model: str
    device: str = "auto"
    dtype: str | None = None
    pooling: str | None = None
    attention: str | None = None  # the attention backend
    attention_kind: str | None = None  # causal | bidirectional: overrides the folder's
    host: str = "127.0.0.1"
    port: int = 50051
    max_batch_tokens: int = 16384
    max_queued_tokens: int = 262144
    drain_seconds: float = 30.0
    batch_wait_ms: float | None = None  # default: 3 on the CPU, 0 on a GPU
    metrics_port: int | None = None  # Prometheus /metrics on its own port; None: off, 0: any

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be in [0, 65535], got {self.metrics_port}")
        if self.batch_wait_ms is not None and self.batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {self.batch_wait_ms}")
        if self.drain_seconds < 0:
            raise ValueError(f"drain_seconds must be >= 0, got {self.drain_seconds}")
        SchedulerConfig(self.max_batch_tokens, self.max_queued_tokens)  # validates the budgets
        if self.attention_kind not in (None, "causal", "bidirectional"):
            raise ValueError(
                f"attention_kind must be causal or bidirectional, got {self.attention_kind!r}"
            )


def load_engine(config: ServerConfig):  # type: ignore[no-untyped-def]
    """The engine for `config.model`, warmed up with one small batch."""
    from embedserve.bundled import resolve_model
    from embedserve.engine.batch import PackedBatch
    from embedserve.engine.engine import Engine

    engine = Engine.from_folder(
        resolve_model(config.model),
        pooling=config.pooling,
        attention_kind=config.attention_kind,
        device=config.device,
        dtype=config.dtype,
        attention=config.attention,
    )
    warm = PackedBatch.from_packed(np.arange(100, 132, dtype=np.int64), np.array([16, 16]))
    engine.step(warm).wait()
    return engine


async def serve(config: ServerConfig) -> None:
    from embedserve.engine.spans import embed_spans

    engine = load_engine(config)
    batch_wait_ms = config.batch_wait_ms
    if batch_wait_ms is None:  # a CPU forward has a fixed cost of milliseconds; a GPU one not
        batch_wait_ms = 3.0 if engine.device.type == "cpu" else 0.0
    service = EmbedService(
        engine,
        SchedulerConfig(config.max_batch_tokens, config.max_queued_tokens),
        batch_wait=batch_wait_ms / 1000,
        output_rules=engine.spec.output_rules,
        span_pooler=functools.partial(embed_spans, engine),
    )
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 256 << 20),
        ]
    )
    add_embed_service(server, service.embed)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise OSError(f"cannot listen on {config.host}:{config.port}")
    await service.start()
    await server.start()
    if config.metrics_port is not None:
        from embedserve.server.metrics import start_metrics_server

        metrics_port = start_metrics_server(config.host, config.metrics_port, engine, service)
        print(
            f"embedserve server: metrics on http://{config.host}:{metrics_port}/metrics",
            flush=True,
        )
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"embedserve server: ready on {config.host}:{port} "
        f"({config.model}, {engine.device}, {engine.hidden_size} dims, "
        f"{engine.spec.attention} attention, {engine.spec.pooling} pooling)",
        flush=True,
    )
    await stop.wait()
    print("embedserve server: draining", flush=True)
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace=config.drain_seconds)
    await service.stop()
    print("embedserve server: stopped", flush=True)


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
    sys.exit(run(ServerConfig(model=sys.argv[1] if len(sys.argv) > 1 else "minilm")))
