"""Starting the gateway: one listening socket, `workers` uvicorn processes accepting on it.

The supervisor binds the socket (so `--port 0` gives one real port for all workers), spawns the
workers, and on SIGTERM / Ctrl-C asks each to drain (uvicorn finishes in-flight requests) and
waits for them. Workers run in their own process group, so a terminal's Ctrl-C reaches only the
supervisor and every worker gets exactly one stop signal.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from embedserve.contract import tracing
from embedserve.contract.secret import read_secret
from embedserve.core.chunking import MAX_CHUNKS_PER_DOCUMENT
from embedserve.core.inputs import InputPreparer
from embedserve.core.pairs import PairPreparer
from embedserve.gateway import result_cache
from embedserve.gateway.app import BODY_TIMEOUT, MULTIPROCESS_DIR, GatewayApp
from embedserve.gateway.auth import KeyRing
from embedserve.gateway.coalescing import CALLS_IN_FLIGHT
from embedserve.gateway.connections import ConnectionLimits, bounded_protocol, fit_to_fd_limit
from embedserve.gateway.models import ServedModel, ServedModels, split_named
from embedserve.gateway.pipeline import Pipeline, PipelineLimits
from embedserve.gateway.replicas import ReplicaPool, check_replica
from embedserve.gateway.requests import MAX_TOKENS_PER_REQUEST
from embedserve.gateway.result_cache import ResultCache
from embedserve.gateway.served import PER_MODEL_LIMITS, ModelEntry, load_model, model_entries
from embedserve.gateway.supervisor import supervise
from embedserve.gateway.tei_grpc import TeiGrpc
from embedserve.loading.bundled import DEFAULT_MODEL
from embedserve.memory import TOKENIZER_POOL, tokenizer_threads
from embedserve.options import Options, drain_option, model_option, option
from embedserve.processes import say, set_parent_death_signal
from embedserve.retrieval.results import MAX_MULTIVECTOR_VALUES

# Tokens per server call of a gateway started on its own (`serve` passes its servers' budget).
DEFAULT_PART_TOKENS = 8192


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# A gateway worker per 4 cores, 1 to 8 (16 cores: 4). NOTE: before `gateway.coalescing` merged
# calls, 1, 2 or 4 workers answered 16 clients alike (results/studies/workers-h200-20261201:
# 3,563, 3,894, 3,989 req/s); each is now the floor of its share (results/studies/null-path-*:
# requests per gateway core, no engine behind). On a small machine the rest run the engine.
DEFAULT_WORKERS = min(8, max(1, (os.cpu_count() or 1) // 4))


@dataclass(frozen=True)
class GatewayConfig(Options):
    replicas: tuple[str, ...] = option(
        help="a server's HOST:PORT, or dns:NAME:PORT (every address of the name) or file:PATH "
        "(HOST:PORT lines), looked up again every --resolve-interval (repeatable); with "
        "several models, MODEL=ADDRESS: a server of the model served as MODEL",
        flag="replica",
        metavar="[MODEL=]HOST:PORT",
    )
    models: tuple[str, ...] = option(
        (DEFAULT_MODEL,),
        f"{model_option().metadata['help']}; repeatable: several models behind one gateway, "
        "each NAME=MODEL to serve it as NAME",
        flag="model",
        metavar="[NAME=]MODEL",
        first_as="model",
    )
    served_model_names: tuple[str, ...] = option(
        (),
        "a name clients use for the model, repeatable; the first is reported "
        "(default: the bundled name or the folder name)",
        flag="served-model-name",
    )
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(8000, "HTTP port (0: any free port)")
    workers: int = option(
        0,
        "the front's workers taking HTTP requests on the one port: the native front's threads "
        "(0: one per 4 cores, 1 to 4), the Python gateway's processes (0: one per 4 cores, 1 "
        "to 8)",
    )
    max_body_bytes: int = option(16 << 20, "larger request bodies get HTTP 413")
    max_header_bytes: int = option(
        ConnectionLimits.max_header_bytes, "a request line and headers over this get HTTP 431"
    )
    max_headers: int = option(ConnectionLimits.max_headers, "more header lines get HTTP 431")
    header_timeout: float = option(
        ConnectionLimits.header_timeout,
        "seconds from a connection's accept (or a request's first byte) to the end of its "
        "headers; past it HTTP 408 (a connection that sent nothing is closed)",
    )
    body_timeout: float = option(
        BODY_TIMEOUT, "seconds the body may take to arrive after the headers; past it HTTP 408"
    )
    max_connections: int = option(
        ConnectionLimits.max_connections,
        "open connections per gateway worker: a new one closes the longest idle; when every one "
        "has a request in progress, HTTP 503",
    )
    max_inputs: int = option(2048, "inputs (documents) per request")
    max_chunks_per_document: int = option(
        MAX_CHUNKS_PER_DOCUMENT, "chunks per document of a contextualized-embeddings request"
    )
    max_tokens_per_request: int = option(MAX_TOKENS_PER_REQUEST, "real tokens per request")
    max_multivector_values: int = option(
        MAX_MULTIVECTOR_VALUES,
        "floats of multi-vector output (token vectors x dims) per request of a ColBERT or "
        "bge-m3 model; a request whose answer would be larger gets HTTP 400 before any work",
    )
    part_tokens: int | None = option(
        None,
        "split requests into parts (server calls) of at most this many tokens (default: with "
        f"serve, the servers' batch budget; a gateway started alone, {DEFAULT_PART_TOKENS}); "
        "--chunk-tokens is its old, deprecated name",
        aliases=("chunk-tokens",),
    )
    calls_in_flight: int | None = option(
        None,
        "small server calls (queries) a worker keeps out per model; more wait and go merged "
        f"when one returns (0: no bound; default {CALLS_IN_FLIGHT}, with serve on CPUs 0)",
    )
    cache_size: int = option(
        result_cache.OFF,
        "bytes of dense embeddings kept per model to answer repeated inputs (an LRU, per API "
        "key; docs/serving.md#result-cache); with --workers N each worker keeps BYTES/N, so "
        "the gateway's total is BYTES (default 0: off)",
        metavar="BYTES",
    )
    api_keys: tuple[str, ...] = option(
        (),
        "a key clients must send as Authorization: Bearer KEY, repeatable (visible in the "
        "process list: prefer --api-key-file)",
        flag="api-key",
        metavar="KEY",
    )
    api_key_file: str | None = option(
        None, "a file of API keys, one per line; read again on SIGHUP", metavar="PATH"
    )
    metrics_open: bool = option(
        False, "/metrics answers without a key (by default it needs one when keys are set)"
    )
    allowed_hosts: tuple[str, ...] = option(
        (),
        "a Host name this gateway answers to, repeatable; others get HTTP 421 (default: when "
        "bound to loopback, localhost, 127.0.0.1 and ::1; else any)",
        flag="allowed-host",
        metavar="NAME",
    )
    log_requests: bool = option(
        False, "one JSON line per request on stderr (id, route, status, ms, tokens; no text)"
    )
    otlp_endpoint: str | None = option(
        None,
        "export OpenTelemetry spans of each request over OTLP/HTTP (protobuf) to this collector "
        "URL, e.g. http://127.0.0.1:4318 (POSTs to /v1/traces); default: no tracing",
        metavar="URL",
    )
    link_secret_file: str | None = option(
        None,
        "the servers' link secret (their --link-secret-file), sent with each call",
        metavar="PATH",
    )
    request_timeout: float = option(30.0, "deadline of each server call (s)")
    health_interval: float = option(0.5, "replica health polling interval (s)")
    resolve_interval: float = option(
        5.0, "how often dns: and file: replicas are looked up again (s)"
    )
    drain_seconds: float = drain_option()
    tei_grpc_port: int | None = option(
        None,
        "serve text-embeddings-inference's gRPC API (tei.proto) on this port too, from every "
        "worker, on --host (0: any free port); default: off",
    )
    default_models: tuple[str, ...] = option(
        (),
        "with several models, the one a request that names none goes to: TASK=NAME for the "
        "routes of one task (embed, score, classify), NAME alone for its own task and for "
        "POST /, /info and /tokenize (repeatable; stated in /info's default_for)",
        flag="default-model",
        metavar="[TASK=]NAME",
    )
    native: bool | None = option(
        None,
        "the native front (Rust: HTTP, JSON, tokenization, the calls to the servers), the "
        "default; under serve, the engine in its process too, or its server processes behind "
        'it (docs/native.md, "serve --native"); --no-native: the Python gateway\'s processes',
    )
    model_limits: tuple[str, ...] = option(
        (),
        f"one model's own limit (KEY: {', '.join(PER_MODEL_LIMITS)}), repeatable; the others "
        "keep the gateway-wide flag's (serve --config passes its file's)",
        flag="model-limit",
        metavar="NAME:KEY=VALUE",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.replicas:
            raise ValueError("a gateway needs at least one --replica HOST:PORT")
        if not self.models:
            raise ValueError("a gateway needs a --model")
        for entry in self.entries:
            for r in entry.replicas:
                check_replica(r)
        for name in ("port", "tei_grpc_port"):
            if not 0 <= (getattr(self, name) or 0) < 65536:
                raise ValueError(f"{name} must be in [0, 65535], got {getattr(self, name)}")
        for name in (
            "max_body_bytes",
            "max_header_bytes",
            "max_headers",
            "header_timeout",
            "body_timeout",
            "max_connections",
            "max_inputs",
            "max_chunks_per_document",
            "max_tokens_per_request",
            "max_multivector_values",
            "request_timeout",
            "health_interval",
            "resolve_interval",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("workers", "drain_seconds", "calls_in_flight", "cache_size"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.part_tokens is not None and self.part_tokens <= 0:
            raise ValueError(f"part_tokens must be positive, got {self.part_tokens}")

    @property
    def host_names(self) -> frozenset[str]:
        """The Host names served (empty: any): as given, else the local names on loopback."""
        if self.allowed_hosts:
            return frozenset(h.lower() for h in self.allowed_hosts)
        if self.host in LOOPBACK_HOSTS:
            return frozenset(LOOPBACK_HOSTS)
        return frozenset()

    @property
    def model(self) -> str:
        """The first model's folder, bundled name or Hub id (with one model: the model)."""
        return split_named(self.models[0])[1]

    @property
    def model_names(self) -> tuple[str, ...]:
        """The first model's served names (with one model: its names)."""
        return self.entries[0].names

    @property
    def entries(self) -> list[ModelEntry]:
        """Each model's names, folder, replicas and limits (--model, --replica, --model-limit)."""
        own = (self.model_limits, {key: getattr(self, key) for key in PER_MODEL_LIMITS})
        return model_entries(self.models, self.served_model_names, self.replicas, *own)


def build_app(config: GatewayConfig, keys: KeyRing | None = None) -> GatewayApp:
    keys = keys or KeyRing(config.api_keys, config.api_key_file)
    secret = read_secret(config.link_secret_file) if config.link_secret_file else None
    served = []
    for entry in config.entries:
        own = entry.limits  # the model's own, else the gateway-wide flags' (`model_entries`)
        limits, inputs, pairs = load_model(
            entry, own["max_inputs"], own["max_chunks_per_document"], config.max_multivector_values
        )
        served.append(
            ServedModel(
                limits,
                functools.partial(make_pipeline, config, entry, secret, inputs, pairs),
                max_tokens_per_request=own["max_tokens_per_request"],
            )
        )
    return GatewayApp(
        ServedModels(served, config.default_models),
        max_body_bytes=config.max_body_bytes,
        body_timeout=config.body_timeout,
        api_keys=keys,
        metrics_open=config.metrics_open,
        allowed_hosts=config.host_names,
        log_requests=config.log_requests,
    )


def make_pipeline(
    config: GatewayConfig,
    entry: ModelEntry,
    secret: str | None,
    inputs: InputPreparer,
    pairs: PairPreparer | None,
) -> Pipeline:
    """One model's pipeline over its own replicas, under its own limits; inside the worker's
    event loop (grpc.aio channels)."""
    own = entry.limits
    # each worker its share, so the workers' caches add up to --cache-size
    cache = ResultCache(config.cache_size // max(1, config.workers))
    pool = ReplicaPool(
        entry.replicas,
        secret=secret,
        timeout=config.request_timeout,
        health_interval=config.health_interval,
        resolve_interval=config.resolve_interval,
        on_change=cache.clear,  # a replica back or new: the model may have changed
    )
    part = part_tokens(entry)
    limits = PipelineLimits(
        own["max_tokens_per_request"], part, calls_in_flight=config.calls_in_flight
    )
    return Pipeline(inputs, pool, limits, pairs, cache)


def part_tokens(entry: ModelEntry) -> int:
    """A model's tokens per part of a request: its own, else the gateway's, else the default."""
    return int(entry.limits["part_tokens"] or DEFAULT_PART_TOKENS)


def log_requests_to_stderr() -> None:
    """`--log-requests`: one line per request on stderr, the message alone."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    requests_log = logging.getLogger("embedserve.gateway.requests")
    requests_log.addHandler(handler)
    requests_log.setLevel(logging.INFO)
    requests_log.propagate = False


def run_worker(config: GatewayConfig, sock: socket.socket, restarts: int = 0) -> None:
    """One worker: uvicorn on `sock`; `restarts` so far (in /metrics)."""
    os.setpgrp()
    set_parent_death_signal()
    import uvicorn

    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    limits = ConnectionLimits(
        config.max_header_bytes, config.max_headers, config.header_timeout, config.max_connections
    )
    http: Any
    concurrency: int | None = None  # the bounded protocol keeps its own count (`connections`)
    try:
        import httptools  # noqa: F401

        http = bounded_protocol(limits)
    except ImportError:  # h11 bounds the headers itself (no header timeout there)
        http, concurrency = "h11", config.max_connections
    keys = KeyRing(config.api_keys, config.api_key_file)
    signal.signal(signal.SIGHUP, lambda signum, frame: keys.reload())
    if config.log_requests:
        log_requests_to_stderr()
    app = build_app(config, keys)
    app.metrics.worker_restarts.set(restarts)
    if config.tei_grpc_port is not None:
        app.services.append(TeiGrpc(app, config.host, config.tei_grpc_port))
    tracing.configure(config.otlp_endpoint, tracing.GATEWAY_SERVICE)  # per worker: its own thread
    server = draining_server(
        app,
        config.drain_seconds,
        uvicorn.Config(
            app,
            loop=loop,
            http=http,
            lifespan="on",
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=int(config.drain_seconds),
            timeout_keep_alive=30,
            limit_concurrency=concurrency,
            h11_max_incomplete_event_size=config.max_header_bytes,
        ),
    )
    server.run(sockets=[sock])
    if tracing.TRACER is not None:
        tracing.TRACER.shutdown()


def draining_server(app: GatewayApp, drain_seconds: float, config: Any) -> Any:
    """A uvicorn server whose first SIGTERM / Ctrl-C makes the app answer every new request 503
    (with Retry-After) and fail `/ready` at once, while the requests in flight finish (up to
    `drain_seconds`); then uvicorn shuts down. A second signal is uvicorn's own (exit now).
    uvicorn is imported here, in the worker processes only."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if app.draining:
                super().handle_exit(sig, frame)
                return
            app.draining = True
            threading.Thread(target=self._exit_when_idle, daemon=True).start()

        def _exit_when_idle(self) -> None:
            deadline = time.monotonic() + drain_seconds
            while app.in_flight and time.monotonic() < deadline:
                time.sleep(0.01)
            self.should_exit = True

    return DrainingServer(config)


def _listening(config: GatewayConfig) -> str:
    """What the gateway's listening line says after its URL."""
    workers = f"{config.workers} worker{'s' if config.workers > 1 else ''}"
    parts = f"{config.part_tokens or DEFAULT_PART_TOKENS} tokens"
    return (
        f"serving {', '.join(e.names[0] for e in config.entries)}; {workers}, replicas "
        f"{', '.join(config.replicas)}, parts of {parts}"
    )


def run(config: GatewayConfig) -> int:
    """Run `config.workers` workers (`run_worker`) on one port, restarting any that dies, until
    SIGTERM / Ctrl-C."""
    # NOTE: 0 is the default, resolved here and not in the flag's default: `serve --native`
    # tells a count the user gave from the one the cores chose (a container reports the host's)
    config = replace(config, workers=config.workers or DEFAULT_WORKERS)
    connections, warning = fit_to_fd_limit(config.max_connections)
    if warning is not None:
        say(f"embedserve gateway: warning: {warning}", err=True)
    config = replace(config, max_connections=connections)
    build_app(config)  # fail fast, in the launcher, on a bad model or flag
    metrics_dir = None
    if config.workers > 1:  # /metrics must add up the workers: prometheus multiprocess mode
        metrics_dir = tempfile.mkdtemp(prefix="embedserve-metrics-")
        os.environ[MULTIPROCESS_DIR] = metrics_dir  # inherited by the spawned workers
    # each worker's tokenizer pool, unless the environment names one (`memory.tokenizer_threads`)
    os.environ.setdefault(TOKENIZER_POOL, str(tokenizer_threads(os.cpu_count(), config.workers)))
    try:
        return supervise(config, run_worker, _listening(config))
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
