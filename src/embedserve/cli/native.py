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

One model, one engine (a GPU or the CPU). An LLM reranker's, a classifier's or a
multi-vector model's requests all go through the Python front, and so do a sparse model's but
the plain `/embed_sparse` (Ivy answers plain dense embeddings, sparse vectors and a
cross-encoder's scores only); `serve` without `--native` serves several models.
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

from embedserve.contract import tracing
from embedserve.core.lanes import BULK_INPUTS, BULK_TOKENS
from embedserve.gateway.connections import fit_to_fd_limit
from embedserve.gateway.main import GatewayConfig
from embedserve.gateway.metrics import LATENCY_BUCKETS
from embedserve.gateway.pipeline import PARTS_IN_FLIGHT
from embedserve.gateway.replicas import IN_PROCESS, IN_PROCESS_ADDRESS
from embedserve.gateway.requests import MAX_TOKENS_PER_REQUEST
from embedserve.gateway.scoring import RERANK_TRUNCATE
from embedserve.gateway.workers import AGAIN_AFTER_S
from embedserve.loading.retrieval_kinds import KIND_BY_NAME
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


def ivy_threads(cores: int | None) -> int:
    """Ivy's worker threads: one per 4 cores, 1 to 4 (the engine and results threads, and the
    Python front's loop, need the rest)."""
    return max(1, min(4, (cores or 1) // 4))


def why_not_native(
    servers: list[ServerConfig], gateway: GatewayConfig, replicas: int
) -> str | None:
    """Why the flags given are not served natively (one model on one engine, one worker), or
    None: they are. `replicas`: `--replicas` as given (its
    default, one engine per visible GPU, is not the user's: --native serves the first)."""
    if len(gateway.entries) != 1:
        return (
            f"--native serves one model; these flags ask {len(gateway.entries)} (give one --model)"
        )
    if replicas > 1:
        return f"--native serves from one engine; --replicas {replicas} was given"
    if gateway.workers > 1:  # 0: the default
        return f"--native runs one process; --workers {gateway.workers} was given"
    return None


def batch_budget(server: ServerConfig, measured: int | None, engine_tokens: int) -> int:
    """Tulip's tokens per batch: `--max-batch-tokens` when given, else the budget measured at
    start-up (the CPU's), else the engine's own (the server's rule, `ServerConfig.scheduler`)."""
    return server.scheduler(measured or engine_tokens).max_batch_tokens


def run_native(server: ServerConfig, gateway: GatewayConfig) -> int:
    """Serve until SIGTERM / Ctrl-C (0); a folder that cannot be served is an error before
    the engine loads (`load_model`'s)."""
    from embedserve.gateway.auth import KeyRing
    from embedserve.gateway.main import build_app, log_requests_to_stderr
    from embedserve.gateway.native_front import PythonFront
    from embedserve.server.tulip_calls import TulipCalls, Watch

    inputs, answered = _served_model(gateway)
    if gateway.log_requests:
        log_requests_to_stderr()
    # the Python front's spans and Ivy's (taken from `native` at each export), one exporter
    tracer = tracing.configure(gateway.otlp_endpoint, tracing.GATEWAY_SERVICE)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="python-front", daemon=True).start()
    calls = TulipCalls(loop)
    IN_PROCESS[IN_PROCESS_ADDRESS] = (calls.embed, calls.check, calls.outstanding_tokens)
    keys = KeyRing(gateway.api_keys, gateway.api_key_file)
    front = PythonFront(loop, gateway.host, gateway.port)
    watch = Watch(
        EngineGuard(
            _give_up, max_failures=server.max_failed_steps, step_timeout=server.step_timeout
        )
    )
    native = _native_gateway(server, gateway, inputs, answered, front, sorted(keys()), calls, watch)
    calls.gateway = native
    if tracer is not None:
        tracer.native = native
    config = dataclasses.replace(
        gateway,
        replicas=(IN_PROCESS_ADDRESS,),
        workers=1,
        calls_in_flight=0,
        part_tokens=gateway.entries[0].limits["part_tokens"] or native.batch_tokens,
    )
    app = build_app(config, keys)
    app.metrics.native_counts = native.take_counts
    metrics_port = _engine_metrics(server, app, calls.seam, watch, native)
    front.app = app
    lifespan, grpc_address = _started(app, loop, gateway)
    _on_signals(native, app, loop, keys, config.drain_seconds)
    _say_ready(gateway, native, answered, grpc_address, metrics_port)
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C while draining
        native.serve()
    if watch.guard.fatal is not None:  # the engine's threads are not waited for
        return FATAL_EXIT_CODE
    watch.guard.stop()
    lifespan.shutdown()
    loop.call_soon_threadsafe(loop.stop)
    if tracer is not None:
        tracer.shutdown()  # the last spans exported
    return 0


def _say_ready(
    gateway: GatewayConfig, native: Any, answered: Any, grpc: str | None, metrics: int | None
) -> None:
    """The ready lines, and the record `serve`'s launcher writes for whoever started it
    (`processes.write_ready`; its ports are kept when it starts this process again)."""
    url = f"http://{gateway.host}:{native.port}"
    say(
        f"embedserve: serving {gateway.entries[0].names[0]} at {url} (native front: plain "
        f"{answered.what} {'answered natively' if answered.any else 'through the Python front'}"
        f"; batch tokens {native.batch_tokens})"
    )
    if grpc is not None:
        say(f"embedserve: TEI's gRPC API at {grpc}")
    record: dict[str, Any] = {"url": url}
    if grpc is not None:
        record["tei_grpc"] = grpc
    if metrics is not None:
        record["metrics_port"] = metrics
    write_ready(record)


def _started(app: Any, loop: asyncio.AbstractEventLoop, gateway: GatewayConfig) -> Any:
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
    server: ServerConfig, app: Any, seam: Any, watch: Any, native: Any
) -> int | None:
    """The engine's metrics and its queue's (`server.metrics`: Tulip's batches and queued
    tokens) on the one port's `/metrics`, and on `--metrics-port` too when given (where a
    server process serves them): that port, or None."""
    from embedserve.server.metrics import ServerCollector, start_metrics_server

    collector = ServerCollector(seam, lambda: watch.num_batches, lambda: native.queued_tokens)
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


@dataclasses.dataclass(frozen=True)
class Answered:
    """What of the model's requests Ivy answers itself (`ivy::front::Served`)."""

    embeddings: bool  # plain dense embeddings
    sparse: bool  # TEI's plain /embed_sparse
    # a cross-encoder's (activation, typed, what Cohere's rerank routes do with a long document)
    reranker: tuple[str, bool, str] | None

    @property
    def any(self) -> bool:
        return self.embeddings or self.sparse or self.reranker is not None

    @property
    def what(self) -> str:
        """What the start-up line says Ivy answers."""
        return "scores" if self.reranker else "sparse vectors" if self.sparse else "embeddings"


def _served_model(gateway: GatewayConfig) -> tuple[Any, Answered]:
    """The one model's inputs and what Ivy answers of it: plain embeddings (or a sparse
    model's plain sparse vectors) when a request with no options asks nothing the request core
    would add (no prompt; float32 and every dimension for dense rows); a cross-encoder's plain
    scores (its activation, whether it has token types), its pairs joined natively. None of
    them under `--cache-size` or `--log-requests` (the cache and the request log are the Python
    front's): every request goes there."""
    from embedserve.gateway.served import load_model

    entry = gateway.entries[0]
    own = entry.limits
    limits, inputs, _ = load_model(
        entry, own["max_inputs"], own["max_chunks_per_document"], gateway.max_multivector_values
    )
    head, spec = inputs.head(), inputs.spec
    python_only = bool(gateway.cache_size or gateway.log_requests)
    unprompted = not python_only and limits.task == "embed" and inputs.options().prompt == ""
    plain = (
        unprompted
        and limits.retrieval is None
        and head.output_dtype == "float32"
        and head.dimensions == limits.hidden_size
    )
    kind = KIND_BY_NAME.get(limits.retrieval or "")
    # a ColBERT model's inputs take markers (`prepare_outputs`): none has sparse outputs
    sparse = unprompted and kind is not None and "sparse" in kind.outputs
    score, reranker = spec.score, None
    paired = inputs.tokenizer.pair_template is not None
    if not python_only and score is not None and score.kind == "classifier" and paired:
        typed = spec.type_vocab_size > 1  # segment embeddings: the document is type 1
        reranker = (score.activation, typed, RERANK_TRUNCATE)
    return inputs, Answered(plain, sparse, reranker)


def own_max_tokens(entry: Any) -> int:
    """A model's tokens per request (`--max-tokens-per-request`, else the default)."""
    return int(entry.limits["max_tokens_per_request"] or MAX_TOKENS_PER_REQUEST)


def _builder(server: ServerConfig, calls: Any, sparse: bool, name: str, watch: Any) -> Any:
    """`build()` as Tulip's engine thread calls it first (the thread that then runs every
    step): the engine built, `calls` given its record, the ready line said, the engine guard
    started; its `step`, batch tokens, batch wait (the server's) and, for Ivy's
    `/embed_sparse`, its sparse outputs, each under `watch`."""
    from embedserve.server import main as server_main
    from embedserve.server.output_requests import MultivectorLimit
    from embedserve.server.service import launch
    from embedserve.server.tulip_calls import packed_step, sparse_step

    def build() -> tuple[Any, int, float, Any]:
        engine, measured = server_main._build_engine(server)
        calls.seam = engine.seam()  # its `retrieval` is the spec (the engine's, the heads)
        calls.launch = watch(launch)
        calls.multivector_limit = MultivectorLimit.of(
            calls.seam.retrieval, server.max_multivector_values
        )
        budget = batch_budget(server, measured, engine.batch_tokens)
        # what is served, in which precision (the line a server process says when ready)
        say(
            f"embedserve server: ready in this process (serving {name}: {calls.seam.serving}, "
            f"batch tokens {budget})"
        )
        watch.guard.start()
        return (
            watch(packed_step(engine)),
            budget,
            server_main.batch_wait_seconds(server, calls.seam.on_cpu),
            watch(sparse_step(calls.seam)) if sparse else None,
        )

    return build


def _native_gateway(
    server: ServerConfig, gateway: GatewayConfig, inputs: Any, answered: Answered, front: Any,
    keys: list[bytes], calls: Any, watch: Any,
) -> Any:  # fmt: skip
    """Ivy and Tulip, bound to the port; Tulip's engine thread builds the engine first (and
    gives `calls` its record), each batch under `watch`."""
    from embedserve._native import Gateway
    from embedserve.core.bounds import max_chars

    entry = gateway.entries[0]
    build = _builder(server, calls, answered.sparse, entry.names[0], watch)
    connections, warning = fit_to_fd_limit(gateway.max_connections)
    if warning is not None:
        say(f"embedserve: warning: {warning}", err=True)
    own = entry.limits
    return Gateway(
        inputs.tokenizer.json,
        build,
        front,
        names=list(entry.names),
        max_length=inputs.tokenizer.max_length,
        fast=answered.embeddings,
        normalize=inputs.head().normalize,
        sparse=answered.sparse,
        max_body_bytes=gateway.max_body_bytes,
        max_inputs=own["max_inputs"],
        max_tokens=own_max_tokens(entry),
        # the character bounds of `core/bounds.text_chars` and `pair_chars`
        max_chars=max_chars(own_max_tokens(entry)),
        window_chars=inputs.tokenizer.window_chars,
        part_tokens=own["part_tokens"] or 0,
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
        max_queued_tokens=server.max_queued_tokens,
        batch_wait_requests=BATCH_WAIT_MAX_REQUESTS,
        host=gateway.host,
        port=gateway.port,
        threads=ivy_threads(os.cpu_count()),
        # the lane rule, declared once (`core.lanes`, `server.scheduler`); None: --lanes off
        lanes=(BULK_EVERY, BULK_INPUTS, BULK_TOKENS) if server.lanes == "on" else None,
        reranker=answered.reranker,
        # spans held for the exporter (`--otlp-endpoint`; 0: tracing off)
        traces=tracing.MAX_QUEUED if tracing.TRACER is not None else 0,
    )


def _on_signals(native: Any, app: Any, loop: Any, keys: Any, drain_seconds: float) -> None:
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
