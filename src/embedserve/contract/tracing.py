"""Request tracing: OpenTelemetry spans exported over OTLP/HTTP when `--otlp-endpoint` is set.

Three spans per request, one trace: `gateway request` (the HTTP request, in the gateway),
`server request` (each server call it makes) and `engine step` (the batch that request ran in,
on the engine thread), each with the request id (`x-request-id`) as `embedserve.request_id`.
The gateway hands its span's context to the server as a W3C `traceparent` in the
EmbedRequest itself (`traceparent`, with `request_id`), so it crosses both transports, gRPC and the local unix
socket, and a caller's own `traceparent` header makes the gateway's span its child.

Off by default and free when off: `TRACER` is None, every hook is one module attribute test,
and nothing here is imported by a process that does not trace beyond this module (no
OpenTelemetry package at all: the spans are written as OTLP protobuf with `otlp_trace_pb2`, the
part of the collector's messages we use, and posted with the standard library from one
background thread, in batches).
"""

from __future__ import annotations

import contextvars
import logging
import os
import queue
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("embedserve.tracing")

EXPORT_EVERY = 0.5  # s between exports: spans wait at most this long
GATEWAY_SERVICE, SERVER_SERVICE = "embedserve-gateway", "embedserve-server"  # service.name
MAX_QUEUED = 10_000  # spans held for the exporter; past this they are dropped (and counted)
SERVER, INTERNAL = 2, 1  # OTLP span kinds

# the current span's context in this task (gateway: the HTTP request's; server: the call's)
CURRENT: contextvars.ContextVar[SpanContext | None] = contextvars.ContextVar(
    "embedserve_trace", default=None
)


@dataclass(frozen=True)
class SpanContext:
    trace_id: bytes  # 16 bytes
    span_id: bytes  # 8 bytes
    request_id: str = ""

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id.hex()}-{self.span_id.hex()}-01"


def parse_traceparent(value: str, request_id: str = "") -> SpanContext | None:
    """A W3C `traceparent`'s context; None for an empty or malformed one (then a new trace)."""
    parts = value.strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
    except ValueError:
        return None
    if not any(trace_id) or not any(span_id):
        return None
    return SpanContext(trace_id, span_id, request_id)


@dataclass
class Span:
    """One span being timed; `end()` hands it to the exporter."""

    tracer: Tracer
    name: str
    context: SpanContext
    parent: bytes  # the parent span id, or b"" for a trace's root
    kind: int = INTERNAL
    start_ns: int = field(default_factory=time.time_ns)
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    service: str = ""  # its process's part, where not the tracer's (`SERVER_SERVICE`)

    def end(self, end_ns: int | None = None) -> None:
        self.tracer.finished(self, end_ns or time.time_ns())


class Tracer:
    """Spans of one process, exported in batches to `endpoint` (OTLP/HTTP, protobuf)."""

    def __init__(self, endpoint: str, service: str) -> None:
        endpoint = endpoint.rstrip("/")
        self.url = endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"
        self.service = service
        self.dropped = 0
        # the native front's spans, taken at each export (`Gateway.take_spans`)
        self.native: Any = None
        self._queue: queue.Queue[tuple[Span, int]] = queue.Queue(MAX_QUEUED)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def start(
        self,
        name: str,
        parent: SpanContext | None,
        *,
        kind: int = INTERNAL,
        request_id: str = "",
        start_ns: int | None = None,
    ) -> Span:
        """A new span: a child of `parent`, else the root of a new trace."""
        trace_id = parent.trace_id if parent is not None else os.urandom(16)
        request_id = request_id or (parent.request_id if parent is not None else "")
        span = Span(
            self,
            name,
            SpanContext(trace_id, os.urandom(8), request_id),
            parent.span_id if parent is not None else b"",
            kind,
        )
        if start_ns is not None:
            span.start_ns = start_ns
        if request_id:
            span.attributes["embedserve.request_id"] = request_id
        return span

    def finished(self, span: Span, end_ns: int) -> None:
        try:
            self._queue.put_nowait((span, end_ns))
        except queue.Full:  # an exporter that cannot keep up never slows requests down
            self.dropped += 1

    def _run(self) -> None:
        while not self._stop.wait(EXPORT_EVERY):
            self.flush()
        self.flush()

    def flush(self) -> None:
        """Export every finished span now (the exporter thread's work; also at shutdown)."""
        spans = self._native_spans()
        while True:
            try:
                spans.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if not spans:
            return
        body = encode(spans, self.service)
        request = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/x-protobuf"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                reply.read()
        except OSError as e:  # a collector that is down loses these spans, nothing else
            log.warning("OTLP export of %d spans to %s failed: %s", len(spans), self.url, e)

    def _native_spans(self) -> list[tuple[Span, int]]:
        """The native front's finished spans (`native/src/ivy/traces.rs`), as this module's."""
        if self.native is None:
            return []
        taken, dropped = self.native.take_spans()
        self.dropped += dropped
        out = []
        for name, trace_id, span_id, parent, kind, start_ns, end_ns, attributes in taken:
            service = GATEWAY_SERVICE if name == "gateway request" else SERVER_SERVICE
            context = SpanContext(trace_id, span_id)
            span = Span(self, name, context, parent, kind, start_ns, attributes, service=service)
            out.append((span, end_ns))
        return out

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def encode(spans: list[tuple[Span, int]], service: str) -> bytes:
    """An ExportTraceServiceRequest of finished spans, serialized."""
    from embedserve.contract import otlp_trace_pb2 as pb

    def value(v: Any) -> Any:
        if isinstance(v, bool):
            return pb.AnyValue(bool_value=v)
        if isinstance(v, int):
            return pb.AnyValue(int_value=v)
        if isinstance(v, float):
            return pb.AnyValue(double_value=v)
        return pb.AnyValue(string_value=str(v))

    by_service: dict[str, list[Any]] = {}
    for span, end_ns in spans:
        by_service.setdefault(span.service or service, []).append(
            pb.Span(
                trace_id=span.context.trace_id,
                span_id=span.context.span_id,
                parent_span_id=span.parent,
                name=span.name,
                kind=span.kind,
                start_time_unix_nano=span.start_ns,
                end_time_unix_nano=end_ns,
                attributes=[pb.KeyValue(key=k, value=value(v)) for k, v in span.attributes.items()],
                status=pb.Status(code=2, message=span.error) if span.error else None,
            )
        )
    scope = pb.InstrumentationScope(name="embedserve")
    message = pb.ExportTraceServiceRequest(
        resource_spans=[
            pb.ResourceSpans(
                resource=pb.Resource(
                    attributes=[
                        pb.KeyValue(key="service.name", value=pb.AnyValue(string_value=name))
                    ]
                ),
                scope_spans=[pb.ScopeSpans(scope=scope, spans=out)],
            )
            for name, out in by_service.items()
        ]
    )
    return bytes(message.SerializeToString())


TRACER: Tracer | None = None  # set by `configure`; None: tracing is off


def configure(endpoint: str | None, service: str) -> Tracer | None:
    """Start tracing this process to `endpoint` (None: leave it off)."""
    global TRACER
    if endpoint:
        TRACER = Tracer(endpoint, service)
    return TRACER


def wall_ns(perf: float) -> int:
    """A `time.perf_counter()` reading as Unix nanoseconds (for spans timed on the hot path)."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)


# -- the hooks: each a no-op unless `TRACER` is set -------------------------------------------


def gateway_span(headers: dict[bytes, bytes], request_id: str, method: str, route: str) -> Span:
    """The HTTP request's span (a child of the caller's `traceparent` header, if any), made the
    current one for this request's tasks."""
    assert TRACER is not None
    parent = parse_traceparent(headers.get(b"traceparent", b"").decode("latin-1"), request_id)
    span = TRACER.start("gateway request", parent, kind=SERVER, request_id=request_id)
    span.attributes.update({"http.request.method": method, "http.route": route})
    CURRENT.set(span.context)
    return span


def end_gateway_span(span: Span | None, status: int) -> None:
    if span is not None:
        span.attributes["http.response.status_code"] = status
        if status >= 500:
            span.error = f"HTTP {status}"
        span.end()


def stamp(request: Any) -> None:
    """Put the current span's context into an EmbedRequest (`traceparent`)."""
    if TRACER is not None and (context := CURRENT.get()) is not None:
        request.traceparent = context.traceparent
        request.request_id = context.request_id


@dataclass
class RequestTrace:
    """A traced server call's span context, and when the engine took its batch."""

    context: SpanContext
    step_start: float = 0.0  # time.perf_counter()


def current_request() -> RequestTrace | None:
    """The traced server call this task serves (`scheduler.Pending.trace`), or None."""
    context = CURRENT.get() if TRACER is not None else None
    return None if context is None else RequestTrace(context)


class ServerCall:
    """`with ServerCall(request.traceparent, request.request_id):` the server's span of one call (a child of the
    gateway's), current while it runs; its failure recorded on it."""

    def __init__(self, traceparent: str, request_id: str = "") -> None:
        assert TRACER is not None
        parent = parse_traceparent(traceparent, request_id)
        self.span = TRACER.start("server request", parent, kind=SERVER)
        self._token: contextvars.Token[SpanContext | None] | None = None

    def __enter__(self) -> Span:
        self._token = CURRENT.set(self.span.context)
        return self.span

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        if error is not None:
            self.span.error = str(error) or type(error).__name__
        assert self._token is not None
        CURRENT.reset(self._token)
        self.span.end()


def step_started(batch: list[Any], taken: float) -> None:
    """The engine took `batch` (requests with a `trace`) at perf_counter `taken`."""
    for request in batch:
        if request.trace is not None:
            request.trace.step_start = taken


def step_finished(batch: list[Any], ready: float) -> None:
    """`batch`'s rows reached the host at perf_counter `ready`: an `engine step` span under
    each traced request's server span."""
    if TRACER is None:
        return
    tokens = sum(r.num_tokens for r in batch)
    end = wall_ns(ready)
    for request in batch:
        if request.trace is not None:
            span = TRACER.start(
                "engine step", request.trace.context, start_ns=wall_ns(request.trace.step_start)
            )
            span.attributes.update({"embedserve.batch_requests": len(batch),
                                    "embedserve.batch_tokens": tokens})  # fmt: skip
            span.end(end)


def engine_step_before(server: Span, inference_s: float, tokens: int) -> None:
    """An `engine step` span under `server`'s, `inference_s` long and ending now: a step timed
    where it ran (Tulip's, for the native front's Python calls), its rows just answered."""
    if TRACER is None:
        return
    end = time.time_ns()
    span = TRACER.start("engine step", server.context, start_ns=end - int(inference_s * 1e9))
    span.service = server.service
    span.attributes["embedserve.tokens"] = tokens
    span.end(end)
