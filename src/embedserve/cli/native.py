"""`serve --native`: the native front (Ivy and Tulip, `native/`) and the engine in one process.

Ivy reads every HTTP request. The plain shapes of `POST /v1/embeddings` (text input, `model`,
`encoding_format` float or base64) and of TEI's `POST /embed` (text input, `normalize`,
`truncate`), a sparse model's TEI `POST /embed_sparse`, and a cross-encoder's plain
`POST /v1/rerank`, `/rerank`, `/v1/score` and `/v2/rerank`, are answered there: tokenized (pairs joined) in Rust, queued on Tulip, whose
engine thread builds the engine and then calls its `step()` with the GIL held for that call
alone, and written in Rust. Every other request (the other routes, the other options, every
refusal) is handed to the gateway's ASGI app, run here on an event loop of its own thread
(`gateway/native_front.py`), whose pipeline queues on the same Tulip (`server/tulip_calls.py`):
one queue, one engine, each rule and each error message written once, in Python.

Each model on one engine (a GPU or the CPU). An LLM reranker's, a classifier's or a
multi-vector model's requests all go through the Python front, and so do a sparse model's but
the plain `/embed_sparse` (Ivy answers plain dense embeddings, sparse vectors and a
cross-encoder's scores only). Several models: each its own engine and Tulip behind the one
Ivy, a request that names a model answered by that model's (one that names none, with
several, goes to the Python front, whose `--default-model` rule picks).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import threading
import time
from typing import Any

from embedserve.cli.native_models import Answered, Engine, model_spec, served_model
from embedserve.cli.serve_options import served_names, with_part_tokens
from embedserve.contract import tracing
from embedserve.core.lanes import BULK_INPUTS, BULK_TOKENS
from embedserve.gateway.connections import fit_to_fd_limit
from embedserve.gateway.main import GatewayConfig
from embedserve.gateway.metrics import LATENCY_BUCKETS
from embedserve.gateway.models import EMBED, SCORE
from embedserve.gateway.pipeline import PARTS_IN_FLIGHT
from embedserve.gateway.replicas import AVOID_SECONDS, FAILING_AFTER
from embedserve.gateway.workers import AGAIN_AFTER_S
from embedserve.processes import say, write_ready
from embedserve.server.guard import EngineGuard
from embedserve.server.main import (
    FATAL_EXIT_BACKSTOP_SECONDS,
    FATAL_EXIT_CODE,
    FATAL_LINGER_SECONDS,
    ServerConfig,
    exit_soon,
)
from embedserve.server.scheduler import BULK_EVERY
from embedserve.server.service import BATCH_WAIT_MAX_REQUESTS

LANE_RULE = (BULK_EVERY, BULK_INPUTS, BULK_TOKENS)


def ivy_threads(cores: int | None) -> int:
    """Ivy's worker threads: one per 4 cores, 1 to 4 (the engine and results threads, and the
    Python front's loop, need the rest)."""
    return max(1, min(4, (cores or 1) // 4))


def run_native(servers: list[ServerConfig], gateway: GatewayConfig) -> int:
    """Serve until SIGTERM / Ctrl-C (0); a folder that cannot be served is an error before
    the engines load (`load_model`'s). Each model its own engine and Tulip, built in turn."""
    from embedserve.gateway.main import build_app

    models = [served_model(gateway, entry) for entry in gateway.entries]
    side = PythonSide(gateway)
    server = _model_servers(servers, gateway)
    guard = EngineGuard(
        _give_up, max_failures=server[0].max_failed_steps, step_timeout=server[0].step_timeout
    )
    engines = [Engine(side.loop, guard, i) for i in range(len(models))]
    built: list[Any] = []  # (name, config, ready record) of each engine, built in turn
    specs = [
        model_spec(s, e, model, engine, built)
        for s, e, model, engine in zip(server, gateway.entries, models, engines, strict=True)
    ]
    # the lane rule, declared once (`core.lanes`, `server.scheduler`); None: --lanes off
    lanes = LANE_RULE if server[0].lanes == "on" else None
    native = native_gateway(gateway, specs, side.front, sorted(side.keys()), lanes)
    guard.start()  # every engine built
    for engine in engines:
        engine.calls.gateway = native
    app = build_app(_python_front_config(gateway, native, engines), side.keys)
    metrics_port = _engine_metrics(server[0], app, gateway, engines, native)
    grpc_address = side.start(native, app, gateway)
    _say_ready(gateway, native, models, grpc_address, metrics_port)
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C while draining
        native.serve()
    if guard.fatal is not None:  # the engine's threads are not waited for
        return FATAL_EXIT_CODE
    guard.stop()
    side.stop()
    return 0


class PythonSide:
    """The native process's Python front: the gateway's app on an event loop of its own thread,
    which Ivy hands every request it does not answer (`gateway/native_front.py`), with the API
    keys both read and one tracer for the spans of both (Ivy's taken at each export)."""

    def __init__(self, gateway: GatewayConfig) -> None:
        from embedserve.gateway.auth import KeyRing
        from embedserve.gateway.main import log_requests_to_stderr
        from embedserve.gateway.native_front import PythonFront

        if gateway.log_requests:
            log_requests_to_stderr()
        self.tracer = tracing.configure(gateway.otlp_endpoint, tracing.GATEWAY_SERVICE)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="python-front", daemon=True).start()
        self.keys = KeyRing(gateway.api_keys, gateway.api_key_file)
        self.front = PythonFront(self.loop, gateway.host, gateway.port)
        self.lifespan: Any = None

    def start(self, native: Any, app: Any, gateway: GatewayConfig) -> str | None:
        """`app` started as the front behind `native` (its services, TEI's gRPC API among them
        when asked), and the signals handled: the gRPC address, or None."""
        if self.tracer is not None:
            self.tracer.native = native
        app.metrics.native_counts = native.take_counts
        # several models: a body naming none goes where the Python front's rule says, one rule
        served = app.served
        native.set_unnamed(
            served.unnamed(EMBED, ("dense",)),
            served.unnamed(EMBED, ("sparse",)),
            served.unnamed(SCORE),
        )
        self.front.app = app
        self.lifespan, address = started(app, self.loop, gateway)
        on_signals(native, app, self.loop, self.keys, gateway.drain_seconds)
        return address

    def stop(self) -> None:
        """Once `native.serve()` returned: the app's services stopped, the last spans exported."""
        self.lifespan.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.tracer is not None:
            self.tracer.shutdown()


def _model_servers(servers: list[ServerConfig], gateway: GatewayConfig) -> list[ServerConfig]:
    """Each model's server config, in the models' order (here each model has one)."""
    named = served_names(gateway)
    return [servers[named.index(entry.names[0])] for entry in gateway.entries]


def _python_front_config(gateway: GatewayConfig, native: Any, engines: list[Engine]) -> Any:
    """The gateway's config as the Python front runs it here: one worker, each model's replica
    its engine in this process, a request's parts one of its batches (or the model's own)."""
    several = len(engines) > 1
    names = [entry.names[0] for entry in gateway.entries]
    config = dataclasses.replace(
        gateway,
        replicas=tuple(f"{n}=" * several + e.address for n, e in zip(names, engines, strict=True)),
        workers=1,
        calls_in_flight=0,
    )
    budgets = [
        entry.limits["part_tokens"] or native.batch_tokens(i)
        for i, entry in enumerate(gateway.entries)
    ]
    return with_part_tokens(config, names, budgets)


def _say_ready(
    gateway: GatewayConfig,
    native: Any,
    models: list[tuple[Any, Answered]],
    grpc: str | None,
    metrics: int | None,
) -> None:
    """The ready lines (`serve`'s, what Ivy answers of each model beside them), and the record
    `serve`'s launcher writes for whoever started it (`processes.write_ready`; its ports are
    kept when it starts this process again)."""
    url = f"http://{gateway.host}:{native.port}"
    names = [entry.names[0] for entry in gateway.entries]
    each = [
        f"plain {answered.what} "
        f"{'answered natively' if answered.any else 'through the Python front'}"
        f"{'; ' if len(names) == 1 else ', '}batch tokens {native.batch_tokens(i)}"
        for i, (_, answered) in enumerate(models)
    ]
    if len(names) > 1:
        each = [f"{name}: {what}" for name, what in zip(names, each, strict=True)]
    say(f"embedserve: serving {', '.join(names)} at {url} (native front: {'; '.join(each)})")
    if grpc is not None:
        say(f"embedserve: TEI's gRPC API at {grpc}")
    record: dict[str, Any] = {"url": url}
    if grpc is not None:
        record["tei_grpc"] = grpc
    if metrics is not None:
        record["metrics_port"] = metrics
    write_ready(record)


def started(app: Any, loop: asyncio.AbstractEventLoop, gateway: GatewayConfig) -> Any:
    """The Python front's app started on `loop` (its pipelines and services), TEI's gRPC API
    among them when asked (a port in use fails here, before serving): (its lifespan, the gRPC
    address or None)."""
    from embedserve.gateway.native_front import Lifespan
    from embedserve.gateway.sockets import reserve_port
    from embedserve.gateway.tei_grpc import TeiGrpc

    held = reserve_port(gateway.host, gateway.tei_grpc_port)  # port 0: one real port
    address = None
    if held is not None:
        grpc = TeiGrpc(app, gateway.host, held.getsockname()[1])
        app.services.append(grpc)
        address = grpc.address
    lifespan = Lifespan(app, loop)
    lifespan.startup()
    if held is not None:
        held.close()  # the gRPC server listens there now (both set SO_REUSEPORT)
    return lifespan, address


def _engine_metrics(
    server: ServerConfig, app: Any, gateway: GatewayConfig, engines: list[Engine], native: Any
) -> int | None:
    """Each engine's metrics and its queue's (`server.metrics`: Tulip's batches and queued
    tokens; with several models labelled `model`) on the one port's `/metrics`, and on
    `--metrics-port` too when given (where a server process serves them): that port, or None."""
    from embedserve.server.metrics import ModelsCollector, ServerCollector, start_metrics_server

    def of(engine: Engine) -> ServerCollector:
        watch, i = engine.watch, engine.index
        return ServerCollector(
            engine.calls.seam, lambda: watch.num_batches, lambda: native.queued_tokens(i)
        )

    collector: Any = of(engines[0])
    if len(engines) > 1:
        names = [entry.names[0] for entry in gateway.entries]
        collector = ModelsCollector({n: of(e) for n, e in zip(names, engines, strict=True)})
    app.metrics.registry.register(collector)
    if server.metrics_port is not None:
        port = start_metrics_server(server.host, server.metrics_port, collector)
        say(f"embedserve: the engine's metrics on http://{server.host}:{port}/metrics")
        return port
    return None


def _give_up(reason: str) -> None:
    """The engine cannot serve (`EngineGuard`, from the thread that found it): drained as on
    SIGTERM (new requests answered 503), the process ended with FATAL_EXIT_CODE, at the latest
    after the server's backstop (a hung device never returns), for whatever runs it to start
    another."""
    say(f"embedserve: the engine cannot serve, exiting ({reason})", err=True)
    exit_soon(FATAL_EXIT_CODE, FATAL_LINGER_SECONDS + FATAL_EXIT_BACKSTOP_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)


def native_gateway(
    gateway: GatewayConfig,
    specs: list[Any],
    front: Any,
    keys: list[bytes],
    lanes: tuple[int, int, int] | None,
    link_secret: str | None = None,
) -> Any:
    """Ivy and each model's engines (`ServedModel`: a Tulip in this process, each engine
    thread building its engine first, or its server processes), bound to the port."""
    from embedserve._native import Gateway

    connections, warning = fit_to_fd_limit(gateway.max_connections)
    if warning is not None:
        say(f"embedserve: warning: {warning}", err=True)
    return Gateway(
        specs,
        front,
        max_body_bytes=gateway.max_body_bytes,
        parts_in_flight=PARTS_IN_FLIGHT,
        request_timeout=gateway.request_timeout,
        body_timeout=gateway.body_timeout,
        header_timeout=gateway.header_timeout,
        max_header_bytes=gateway.max_header_bytes,
        max_headers=gateway.max_headers,
        max_connections=connections,
        hosts=sorted(gateway.host_names),
        keys=keys,
        latency_buckets=list(LATENCY_BUCKETS),
        batch_wait_requests=BATCH_WAIT_MAX_REQUESTS,
        host=gateway.host,
        port=gateway.port,
        # --workers: Ivy's threads taking HTTP requests (0: by the cores)
        threads=gateway.workers or ivy_threads(os.cpu_count()),
        lanes=lanes,
        # spans held for the exporter (`--otlp-endpoint`; 0: tracing off)
        traces=tracing.MAX_QUEUED if tracing.TRACER is not None else 0,
        # when a server process is passed over (the Python pool's rules)
        avoid=(FAILING_AFTER, AVOID_SECONDS, gateway.health_interval),
        link_secret=link_secret,
    )


def on_signals(native: Any, app: Any, loop: Any, keys: Any, drain_seconds: float) -> None:
    """SIGTERM / Ctrl-C: every new request is answered 503 while those in flight finish, for at
    most `drain_seconds`; a second signal over AGAIN_AFTER_S later stops at once (one within it
    is the same ask: Ctrl-C reaches a process group and its launcher may forward a SIGTERM).
    SIGHUP: the API key file is read again."""
    asked: list[float] = []

    def drained() -> None:
        deadline = time.monotonic() + drain_seconds
        while native.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        native.stop()

    def stop(signum: int, frame: Any) -> None:
        now = time.monotonic()
        if asked and now - asked[0] > AGAIN_AFTER_S:
            native.stop()
        if asked:
            return
        asked.append(now)
        say("embedserve: stopping: draining the requests in flight")
        native.drain()
        loop.call_soon_threadsafe(setattr, app, "draining", True)
        threading.Thread(target=drained, name="drain", daemon=True).start()

    def reload(signum: int, frame: Any) -> None:
        keys.reload()
        native.set_api_keys(sorted(keys()))

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)
