"""Starting one server process: load the engine, warm it up, serve gRPC until SIGTERM / Ctrl-C.

On a signal the health status turns NOT_SERVING (so gateways route elsewhere), new calls are
refused, and calls already accepted finish (up to `drain_seconds`) before the process exits.

An engine that can no longer serve (`server.guard`: failed steps in a row, a CUDA error, a step
stuck past `--step-timeout`) turns the health NOT_SERVING too, fails what is queued as
UNAVAILABLE (gateways retry it elsewhere) and ends the process with FATAL_EXIT_CODE after
FATAL_LINGER_SECONDS, without waiting for the engine: `serve` then starts a new one.
"""

# ruff: noqa: E402  (the CPU threads' policy is set before torch loads)
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedserve import cpu_threads
from embedserve._native import pause_ns

# before torch loads: OpenMP reads it once; the spin's rounds for this CPU's pause
cpu_threads.apply_server(cpu_threads.server_spin_rounds(pause_ns()))

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from embedserve.contract import SERVICE_NAME, add_embed_service, tracing
from embedserve.contract.local import socket_path
from embedserve.contract.secret import LOOPBACK, LinkSecretInterceptor, read_secret
from embedserve.engine.seam import EngineSeam
from embedserve.options import EngineOptions, Options, drain_option, option
from embedserve.processes import say, write_ready
from embedserve.retrieval.results import MAX_MULTIVECTOR_VALUES
from embedserve.server.engine_thread import EngineThread
from embedserve.server.guard import MAX_FAILED_STEPS, STEP_TIMEOUT_SECONDS, EngineGuard
from embedserve.server.local import serve_local
from embedserve.server.output_requests import MultivectorLimit
from embedserve.server.scheduler import BULK_EVERY, SchedulerConfig
from embedserve.server.service import EmbedService
from embedserve.server.warmup import WARMUP_QUERIES, measured_batch_tokens, warm_up_graphs

log = logging.getLogger("embedserve.server")

# The exit status of a server whose engine cannot serve (`serve` restarts it, as any exit).
FATAL_EXIT_CODE = 3
# How long it answers NOT_SERVING before it exits: a gateway's health poll (every 0.5 s) sees
# the status rather than a refused connection, and answers already computed go out.
FATAL_LINGER_SECONDS = 1.0
# After this many more seconds the process ends from a thread of its own, in case the event
# loop itself is stuck.
FATAL_EXIT_BACKSTOP_SECONDS = 10.0


@dataclass(frozen=True)
class ServerConfig(Options):
    engine: EngineOptions = field(default_factory=EngineOptions)
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(50051, "gRPC port (0: any free port)")
    max_batch_tokens: int | None = option(
        None,
        "token budget of one engine batch; a larger request runs alone (default: the engine's "
        "largest CUDA-graph bucket, 8192, on a GPU; on the CPU the tokens it runs in 0.25 s, "
        "measured at start-up, 256 to 2048)",
    )
    max_queued_tokens: int = option(
        SchedulerConfig.max_queued_tokens,
        "refuse new requests (RESOURCE_EXHAUSTED / HTTP 429) beyond this many queued tokens",
    )
    lanes: str = option(
        "on" if SchedulerConfig.lanes else "off",
        f"on: interactive work first at each batch boundary, bulk 1 batch in {BULK_EVERY} at "
        'least (docs/serving.md, "Priority lanes"); off: one FCFS queue',
        choices=("on", "off"),
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
    warmup_queries: int = option(
        WARMUP_QUERIES,
        "on a GPU, capture at start-up the CUDA graphs that batches of up to N short queries "
        "fall into (each a first step's kernel timings and a second's capture, tenths of a "
        "second a first client would wait); 0: each on first use",
        metavar="N",
    )
    drain_seconds: float = drain_option()
    served_name: str | None = option(
        None,
        "the name clients use for this model (serve passes it), said in the ready line "
        "(default: the model as given)",
        metavar="NAME",
    )
    link_secret_file: str | None = option(
        None,
        "a file with the secret gateways must send (the same file on the gateway): needed when "
        "--host is not loopback",
        metavar="PATH",
    )
    insecure_link: bool = option(
        False, "serve a non-loopback --host without a link secret (a trusted network only)"
    )
    max_failed_steps: int = option(
        MAX_FAILED_STEPS,
        "after this many engine batches in a row fail (or one CUDA error), health turns "
        "NOT_SERVING and the server exits (serve restarts it)",
    )
    step_timeout: float = option(
        STEP_TIMEOUT_SECONDS,
        "a batch on the engine longer than this many seconds (a hung device) turns health "
        "NOT_SERVING and the server exits (serve restarts it)",
        metavar="SECONDS",
    )
    max_multivector_values: int = option(
        MAX_MULTIVECTOR_VALUES,
        "floats of multi-vector output (token vectors x dims) per call of a ColBERT or bge-m3 "
        "model; a larger call gets INVALID_ARGUMENT before it is queued (serve: the gateway's "
        "--max-multivector-values)",
    )
    cpu_threads: int | None = option(
        None,
        "torch's CPU threads (torch.set_num_threads); serve with several models gives each "
        "model's servers max(1, cores // models) (default: torch's, every core)",
    )
    otlp_endpoint: str | None = option(
        None,
        "export OpenTelemetry spans of each request over OTLP/HTTP (protobuf) to this collector "
        "URL, e.g. http://127.0.0.1:4318 (POSTs to /v1/traces); default: no tracing",
        metavar="URL",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {self.cpu_threads}")
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
        if self.max_failed_steps < 1:
            raise ValueError(f"max_failed_steps must be >= 1, got {self.max_failed_steps}")
        if self.step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 seconds, got {self.step_timeout}")
        if self.max_multivector_values <= 0:
            raise ValueError(
                f"max_multivector_values must be positive, got {self.max_multivector_values}"
            )
        if self.warmup_queries < 0:
            raise ValueError(f"warmup_queries must be >= 0, got {self.warmup_queries}")
        self.scheduler(1)  # validates the budgets

    def scheduler(self, engine_batch_tokens: int) -> SchedulerConfig:
        """The queue's budgets; a batch budget left unset is the engine's own."""
        budget = engine_batch_tokens if self.max_batch_tokens is None else self.max_batch_tokens
        return SchedulerConfig(budget, self.max_queued_tokens, lanes=self.lanes == "on")


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
        cpu_path=options.cpu_path,
    )
    warm = PackedBatch.from_packed(np.arange(100, 132, dtype=np.int64), np.array([16, 16]))
    engine.step(warm).wait()
    return engine


def _build_engine(config: ServerConfig):  # type: ignore[no-untyped-def]
    if config.cpu_threads is not None:  # before the engine loads: its warm-up runs on them
        import torch

        torch.set_num_threads(config.cpu_threads)
    engine = load_engine(config.engine)
    warm_up_graphs(engine, config.warmup_queries)
    return engine, (measured_batch_tokens(engine) if config.max_batch_tokens is None else None)


def _local_socket_path(port: int) -> Path:
    """Our socket in this user's folder (`contract.local.socket_dir`); when that name is taken
    by something we cannot trust, one in a folder of our own that gateways do not know (they
    call over gRPC then)."""
    path = socket_path(port)
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="embedserve-")) / f"{port}.sock"
        log.warning("the local socket is at %s: gateways will call over gRPC", path)
    return path


def exit_soon(code: int, seconds: float) -> None:
    """End the process in `seconds` from a thread, whatever the event loop is doing."""
    timer = threading.Timer(seconds, os._exit, (code,))
    timer.daemon = True
    timer.start()


def _grpc_server(
    config: ServerConfig, service: EmbedService
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """The gRPC server of `service` (the link secret checked when set) with its health service,
    bound to `config`'s address, not started; and the port it got."""
    secret = read_secret(config.link_secret_file) if config.link_secret_file else None
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 256 << 20),
            # NOTE: grpc shares a port with any process that asked the same by default: a
            # second server on a taken port started silently, took half the calls and the
            # first one's unix socket (gateways got the other model's vectors with 200)
            ("grpc.so_reuseport", 0),
        ],
        interceptors=[LinkSecretInterceptor(secret)] if secret else None,
    )
    add_embed_service(server, service.embed)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = server.add_insecure_port(f"{config.host}:{config.port}")
    except RuntimeError:  # grpc's "Failed to bind"
        port = 0
    if port == 0:
        raise PortTaken(config.host, config.port)
    return server, health_servicer, port


class PortTaken(OSError):
    def __init__(self, host: str, port: int) -> None:
        super().__init__(
            f"cannot listen on {host}:{port}: the port is in use (another server?) or the "
            "address is not this machine's; stop it, or pick another with --port (0: any free "
            "port)"
        )


def check_port(host: str, port: int) -> None:
    """`PortTaken` now, before a model loads, when `host:port` cannot be had (port 0: any)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            raise PortTaken(host, port) from None


def _service(
    config: ServerConfig,
    engine: EngineSeam,
    guard: EngineGuard,
    batch_tokens: int,
) -> EmbedService:
    """The queue in front of `engine` and its threads, under `config`'s limits (`batch_tokens`:
    the engine's batch budget, unless the config sets one)."""
    limit = MultivectorLimit.of(engine.retrieval, config.max_multivector_values)
    return EmbedService(
        engine,
        config.scheduler(batch_tokens),
        batch_wait=batch_wait_seconds(config, engine.on_cpu),
        guard=guard,
        multivector_limit=limit,
    )


def batch_wait_seconds(config: ServerConfig, on_cpu: bool) -> float:
    """How long a batch may wait for more requests (`EmbedService._gather`): `--batch-wait-ms`,
    else 3 ms on the CPU, where a forward has a fixed cost of milliseconds, and none on a GPU."""
    batch_wait_ms = config.batch_wait_ms
    if batch_wait_ms is None:
        batch_wait_ms = 3.0 if on_cpu else 0.0
    return batch_wait_ms / 1000


async def serve(config: ServerConfig) -> int:
    """Serve until a signal (0) or until the engine cannot serve (FATAL_EXIT_CODE)."""
    tracing.configure(config.otlp_endpoint, tracing.SERVER_SERVICE)
    check_port(config.host, config.port)
    engine_thread = EngineThread()  # builds the engine, then runs its steps (see its module)
    engine, measured_budget = await asyncio.wrap_future(
        engine_thread.submit(lambda: _build_engine(config))
    )
    seam = engine.seam()  # what the service, the ready line and the metrics read of it
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_fatal(reason: str) -> None:  # from the engine, results or watchdog thread
        exit_soon(FATAL_EXIT_CODE, FATAL_LINGER_SECONDS + FATAL_EXIT_BACKSTOP_SECONDS)
        loop.call_soon_threadsafe(stop.set)

    guard = EngineGuard(
        on_fatal, max_failures=config.max_failed_steps, step_timeout=config.step_timeout
    )
    service = _service(config, seam, guard, measured_budget or seam.batch_tokens)
    server, health_servicer, port = _grpc_server(config, service)
    await service.start(engine_thread)
    guard.start()
    await server.start()
    # the same calls over a unix socket, for a gateway on this host (`contract.local`)
    local_path = _local_socket_path(port)
    local = await serve_local(local_path, service.answer)
    if config.metrics_port is not None:
        from embedserve.server.metrics import ServerCollector, start_metrics_server

        collector = ServerCollector.of(seam, service)
        metrics_port = start_metrics_server(config.host, config.metrics_port, collector)
        say(
            f"embedserve server: metrics on http://{config.host}:{metrics_port}/metrics",
        )
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    _announce_ready(config, engine, seam, service, port, local_path)
    await stop.wait()
    if guard.fatal is not None:
        return await _give_up(guard.fatal, health_servicer, server, local, service)
    say("embedserve server: draining")
    await health_servicer.enter_graceful_shutdown()
    await asyncio.gather(
        server.stop(grace=config.drain_seconds), local.stop(grace=config.drain_seconds)
    )
    await service.stop()
    guard.stop()
    if tracing.TRACER is not None:
        tracing.TRACER.shutdown()  # the last spans exported
    say("embedserve server: stopped")
    return 0


def _announce_ready(
    config: ServerConfig,
    engine: Any,
    seam: EngineSeam,
    service: EmbedService,
    port: int,
    local_path: Path,
) -> None:
    """The ready line (what is served, in which precision: `seam.serving`) and the ready record
    (addresses and the memory stated for `serve`'s check before another model loads on this
    GPU, counted from the `engine`'s modules)."""
    budget = service.scheduler.config.max_batch_tokens
    say(
        f"embedserve server: ready on {config.host}:{port} (serving "
        f"{config.served_name or config.engine.model}: {seam.serving}, "
        f"batch tokens {budget}, local socket {local_path})",
    )
    from embedserve.engine.memory import stated as stated_memory

    memory, device_now = stated_memory(engine, config.engine.model, budget)
    say(f"embedserve server: memory on {memory.device}: {memory.describe()}")
    write_ready(
        {
            "address": f"{config.host}:{port}",
            "max_batch_tokens": budget,
            "local_socket": str(local_path),
            "memory": memory.as_dict(),
            **device_now,
        }
    )


async def _give_up(
    reason: str, health_servicer: Any, server: Any, local: Any, service: EmbedService
) -> int:
    """NOT_SERVING, queued work refused, FATAL_LINGER_SECONDS for the gateways to see it; the
    engine's threads are not waited for (a hung device never returns)."""
    say(f"embedserve server: NOT_SERVING, exiting ({reason})", err=True)
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    service.abandon()
    await asyncio.sleep(FATAL_LINGER_SECONDS)
    await asyncio.gather(server.stop(grace=0), local.stop(grace=0))
    return FATAL_EXIT_CODE


def run(config: ServerConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        code = asyncio.run(serve(config))
    except PortTaken as e:
        say(f"embedserve server: error: {e}", err=True)
        return 1
    if code:  # the engine's threads may be stuck in the device: do not wait for them
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(run(ServerConfig(EngineOptions(model=sys.argv[1] if len(sys.argv) > 1 else "minilm"))))
