"""The HTTP API as a raw ASGI app: routing, bodies, JSON, errors, metrics.

No web framework: one dict of routes and a handful of helpers, which is both what the GPU
machine can run (it has no FastAPI) and the least work per request.
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import prometheus_client as prom
from prometheus_client.multiprocess import MultiProcessCollector

from embedserve.core.inputs import InputError
from embedserve.gateway.errors import ApiError, bad_request, from_input_error
from embedserve.gateway.jsonio import JSONDecodeError, dumps, duplicate_key, loads
from embedserve.gateway.openapi import openapi_document
from embedserve.gateway.pipeline import Pipeline, contextual_body, embeddings_body
from embedserve.gateway.replicas import REPLICAS_CALLED
from embedserve.gateway.requests import (
    Limits,
    parse_contextual,
    parse_embeddings,
    parse_tokenize,
)
from embedserve.gateway.scoring import (
    parse_rerank,
    parse_score,
    parse_tei_rerank,
    rerank_body,
    score_body,
    tei_rerank_body,
)

log = logging.getLogger("embedserve.gateway")
# one JSON line per request with `--log-requests` (no input text, ever): its id, route, status,
# time, prompt tokens, inputs and the server replicas (by index) its calls went to
request_log = logging.getLogger("embedserve.gateway.requests")
# the current request's [prompt tokens, inputs], for its log line
_REQUEST_COUNTS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "embedserve_request_counts", default=None
)
BODY_TIMEOUT = 30.0  # s for a body to arrive after its headers (`--body-timeout`)
REQUEST_ID_MAX = 128  # longer (or unprintable) X-Request-Id values are replaced by our own

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Handler = Callable[[bytes], Awaitable[tuple[int, bytes, bytes]]]

JSON = b"application/json"
RETRYABLE_STATUSES = (429, 503)
RETRY_AFTER_SECONDS = b"1"
# NOTE: prometheus_client reads this when it is imported; the gateway launcher sets it for workers.
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was ready."""


class Metrics:
    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        self.requests = prom.Counter(
            "embedserve_gateway_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = prom.Histogram(
            "embedserve_gateway_request_seconds",
            "HTTP request latency by route",
            ["route"],
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30),
            registry=self.registry,
        )
        self.prompt_tokens = prom.Counter(
            "embedserve_gateway_prompt_tokens", "Prompt tokens embedded", registry=self.registry
        )
        self.inputs = prom.Counter(
            "embedserve_gateway_inputs", "Inputs embedded", registry=self.registry
        )
        self.healthy = prom.Gauge(
            "embedserve_gateway_replica_healthy",
            "1 when the replica passes health checks",
            ["replica"],
            registry=self.registry,
            multiprocess_mode="max",
        )
        self.outstanding = prom.Gauge(
            "embedserve_gateway_replica_outstanding_tokens",
            "Tokens sent to the replica and not answered yet",
            ["replica"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )


class GatewayApp:
    """`await app(scope, receive, send)`; `pipeline` is built at lifespan startup."""

    def __init__(
        self,
        make_pipeline: Callable[[], Pipeline],
        limits: Limits,
        *,
        max_body_bytes: int,
        body_timeout: float = BODY_TIMEOUT,
        api_keys: Callable[[], frozenset[bytes]] = frozenset,
        metrics_auth: bool = False,
        allowed_hosts: frozenset[str] = frozenset(),
        log_requests: bool = False,
    ) -> None:
        """`api_keys`: the keys a client must send as `Authorization: Bearer <key>` (read on
        every request, so a reload takes effect at once; empty: no authentication).
        `allowed_hosts`: the Host header values (without port) served; empty: any."""
        self.allowed_hosts = allowed_hosts
        self.log_requests = log_requests
        self.make_pipeline = make_pipeline
        self.api_keys = api_keys
        # routes open without a key: liveness always, metrics unless `metrics_auth`
        self.open_paths = {"/health"} | (set() if metrics_auth else {"/metrics"})
        self.limits = limits
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout  # s for a body to arrive after its headers
        self.model_name = limits.model_names[0]
        self.metrics = Metrics()
        self.pipeline: Pipeline | None = None
        self._labelled: set[str] = set()  # replica addresses with metric series
        # set on SIGTERM (gateway.main.DrainingServer): every new request but /health gets 503
        # at once while the ones in flight (counted here) finish
        self.draining = False
        self.in_flight = 0
        self.routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/embeddings"): self.embeddings,
            ("POST", "/embeddings"): self.embeddings,
            ("POST", "/v1/contextualizedembeddings"): self.contextualized,
            ("POST", "/contextualizedembeddings"): self.contextualized,
            ("POST", "/v1/rerank"): self.rerank,
            ("POST", "/rerank"): self.tei_rerank,
            ("POST", "/v1/score"): self.score,
            ("POST", "/score"): self.score,
            ("GET", "/v1/models"): self.models,
            ("POST", "/tokenize"): self.tokenize,
            ("GET", "/health"): self.health,
            ("GET", "/ready"): self.ready,
            ("GET", "/metrics"): self.prometheus,
            ("GET", "/openapi.json"): self.openapi,
        }
        self.paths = {path for _, path in self.routes}
        # the work a client's disconnect cancels (with its server calls)
        self.cancellable = {
            self.embeddings,
            self.contextualized,
            self.rerank,
            self.tei_rerank,
            self.score,
        }
        self._openapi = dumps(openapi_document(self.model_name, limits))
        self._metric_children: dict[tuple[str, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.pipeline = self.make_pipeline()
                    await self.pipeline.replicas.start()
                except Exception as e:
                    log.exception("gateway startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.pipeline is not None:
                    await self.pipeline.replicas.close()
                    self.pipeline.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.in_flight += 1
        try:
            await self._http(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        method, path = scope["method"], scope["path"]
        handler = self.routes.get((method, path))
        route = path if path in self.paths else "other"
        extra: tuple[tuple[bytes, bytes], ...] = ()
        headers_in = dict(scope["headers"])  # read once: the checks below all look in it
        request_id = _request_id(headers_in)
        counts = [0, 0]
        _REQUEST_COUNTS.set(counts)
        replicas: set[int] = set()
        REPLICAS_CALLED.set(replicas)
        try:
            if self.allowed_hosts:
                self._check_host(headers_in)
            if path not in self.open_paths:
                self._authenticate(headers_in)
            if self.draining and path != "/health":
                raise ApiError(503, "the gateway is shutting down", code="shutting_down")
            if handler is None:
                raise self._no_route(method, path)
            if method == "POST":
                self._check_content_type(headers_in)
            body = await self._read_body(scope, receive) if method == "POST" else b""
            if handler in self.cancellable:
                status, content_type, payload = await self._unless_disconnected(
                    handler(body), receive
                )
            else:
                status, content_type, payload = await handler(body)
        except ClientGone:
            self.metrics.requests.labels(route, "499").inc()
            return
        except ApiError as e:
            status, content_type, payload = e.status, JSON, dumps(e.body())
            extra = e.headers
        except InputError as e:  # the request core's: the same message as the offline API's
            status, content_type, payload = 400, JSON, dumps(from_input_error(e).body())
        except Exception:
            log.exception("unhandled error on %s %s", method, path)
            error = ApiError(500, "internal error in the gateway", code="server_error")
            status, content_type, payload = 500, JSON, dumps(error.body())
        headers = [
            (b"content-type", content_type),
            (b"content-length", str(len(payload)).encode()),
            (b"x-request-id", request_id),
        ]
        headers += extra
        if status in RETRYABLE_STATUSES:  # full queues and restarting replicas clear quickly
            headers.append((b"retry-after", RETRY_AFTER_SECONDS))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        count, latency = self._route_metrics(route, status)
        count.inc()
        seconds = time.perf_counter() - start
        latency.observe(seconds)
        if self.log_requests:
            request_log.info(
                dumps(
                    {
                        "request_id": request_id.decode("ascii"),
                        "method": method,
                        "route": route,
                        "status": status,
                        "ms": round(seconds * 1e3, 3),
                        "prompt_tokens": counts[0],
                        "inputs": counts[1],
                        "replicas": sorted(replicas),
                    }
                ).decode()
            )

    def _count(self, num_tokens: int, num_inputs: int) -> None:
        """A request's work: into the metrics, and into its log line."""
        self.metrics.prompt_tokens.inc(num_tokens)
        self.metrics.inputs.inc(num_inputs)
        counts = _REQUEST_COUNTS.get()
        if counts is not None:
            counts[:] = [num_tokens, num_inputs]

    def _route_metrics(self, route: str, status: int) -> tuple[Any, Any]:
        """The request counter and latency histogram of a route and status, looked up once."""
        key = (route, status)
        found = self._metric_children.get(key)
        if found is None:
            found = (
                self.metrics.requests.labels(route, str(status)),
                self.metrics.latency.labels(route),
            )
            self._metric_children[key] = found
        return found

    async def _unless_disconnected(
        self, work: Awaitable[tuple[int, bytes, bytes]], receive: Receive
    ) -> tuple[int, bytes, bytes]:
        """`await work`, unless the client disconnects first: then cancel it, which cancels its
        server calls, so the servers drop those requests before they reach the engine."""
        current = asyncio.current_task()
        assert current is not None
        gone = False

        def on_message(watch: asyncio.Future[dict[str, Any]]) -> None:
            nonlocal gone
            if watch.cancelled() or watch.exception() is not None:
                return
            if watch.result()["type"] == "http.disconnect":
                gone = True
                current.cancel()

        # The body is read: the next message is a disconnect, whenever it comes.
        watch = asyncio.ensure_future(receive())
        watch.add_done_callback(on_message)
        try:
            return await work
        except asyncio.CancelledError:
            if gone:
                current.uncancel()
                raise ClientGone from None
            raise
        finally:
            watch.remove_done_callback(on_message)
            watch.cancel()

    def _check_host(self, headers: dict[bytes, bytes]) -> None:
        """A page on another site cannot reach a local server through DNS rebinding: its
        requests carry that site's Host."""
        host = headers.get(b"host", b"").decode("latin-1").strip().lower()
        host = host[1 : host.index("]")] if host.startswith("[") and "]" in host else host
        host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        if host not in self.allowed_hosts:
            raise ApiError(
                421,
                "the Host of this request is not one this server answers to (see --allowed-host)",
                code="host_not_allowed",
            )

    def _authenticate(self, headers: dict[bytes, bytes]) -> None:
        keys = self.api_keys()
        if not keys:
            return
        scheme, _, sent = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer":
            sent = b""
        # NOTE: compare_digest against every key, always: the time to reject a key depends
        # neither on how much of it matches nor on which key it was close to
        matched = False
        for key in keys:
            matched |= hmac.compare_digest(sent.strip(), key)
        if not matched:
            raise ApiError(
                401,
                "a valid API key is required: send Authorization: Bearer <key>"
                if not sent
                else "the API key is not valid",
                code="invalid_api_key",
                headers=((b"www-authenticate", b"Bearer"),),
            )

    @staticmethod
    def _check_content_type(headers: dict[bytes, bytes]) -> None:
        value = headers.get(b"content-type")
        # none at all: curl -d and many clients send JSON without one; it is read as JSON (and a
        # body that is not gets a 400)
        if value is None:
            return
        media = value.split(b";", 1)[0].strip().lower()
        if media != b"application/json" and not media.endswith(b"+json"):
            raise ApiError(
                415,
                f"Content-Type {value.decode('latin-1')!r} is not JSON; send application/json",
                code="unsupported_media_type",
            )

    def _no_route(self, method: str, path: str) -> ApiError:
        if path in self.paths:
            allowed = ", ".join(m for m, p in self.routes if p == path)
            return ApiError(
                405,
                f"{method} is not allowed on {path}; use {allowed}",
                code="method_not_allowed",
                headers=((b"allow", allowed.encode()),),
            )
        return ApiError(404, f"no route {method} {path}", code="not_found")

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise self._too_large()
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + self.body_timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise ApiError(
                    408,
                    f"the request body did not arrive within {self.body_timeout:g} s",
                    code="body_timeout",
                    headers=((b"connection", b"close"),),  # the rest of it is not awaited
                ) from None
            if message["type"] == "http.disconnect":
                raise asyncio.CancelledError
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            f"request body is over the limit of {self.max_body_bytes} bytes",
            code="body_too_large",
        )

    def _json(self, body: bytes) -> Any:
        if not body:
            raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
        try:
            parsed = loads(body)
        except JSONDecodeError as e:
            raise bad_request(f"the body is not valid JSON: {e}", code="invalid_json") from None
        key = duplicate_key(body, parsed)
        if key is not None:
            raise bad_request(
                f"the key {key!r} appears twice in the request; send it once",
                param=key,
                code="duplicate_key",
            )
        return parsed

    def _ready_pipeline(self) -> Pipeline:
        if self.pipeline is None:
            raise ApiError(503, "the gateway is starting", code="starting")
        return self.pipeline

    def _embedding_pipeline(self) -> Pipeline:
        pipeline = self._ready_pipeline()
        if pipeline.pairs is not None:
            raise bad_request(
                f"model {self.model_name!r} is a reranker: it scores query/document pairs and "
                "does not embed; use /v1/rerank, /rerank or /v1/score",
                param="model",
                code="wrong_model_task",
            )
        return pipeline

    async def embeddings(self, body: bytes) -> tuple[int, bytes, bytes]:
        pipeline = self._embedding_pipeline()
        job = parse_embeddings(self._json(body), self.limits, pipeline.inputs)
        vectors, num_tokens = await pipeline.embed(job)
        self._count(num_tokens, len(vectors))
        return (
            200,
            JSON,
            dumps(embeddings_body(vectors, job.encoding_format, self.model_name, num_tokens)),
        )

    async def contextualized(self, body: bytes) -> tuple[int, bytes, bytes]:
        pipeline = self._embedding_pipeline()
        job = parse_contextual(self._json(body), self.limits, pipeline.inputs)
        documents, num_tokens = await pipeline.contextual(job)
        self._count(num_tokens, job.num_chunks)
        return (
            200,
            JSON,
            dumps(contextual_body(documents, job.encoding_format, self.model_name, num_tokens)),
        )

    async def rerank(self, body: bytes) -> tuple[int, bytes, bytes]:
        pipeline = self._ready_pipeline()
        job, top_n, return_documents = parse_rerank(self._json(body), self.limits)
        scores, num_tokens = await pipeline.score(job)
        self._count(num_tokens, job.num_documents)
        docs = job.groups[0][1]
        return (
            200,
            JSON,
            dumps(rerank_body(scores, docs, top_n, return_documents, self.model_name, num_tokens)),
        )

    async def tei_rerank(self, body: bytes) -> tuple[int, bytes, bytes]:
        pipeline = self._ready_pipeline()
        job, return_text = parse_tei_rerank(self._json(body), self.limits)
        scores, num_tokens = await pipeline.score(job)
        self._count(num_tokens, job.num_documents)
        return 200, JSON, dumps(tei_rerank_body(scores, job.groups[0][1], return_text))

    async def score(self, body: bytes) -> tuple[int, bytes, bytes]:
        pipeline = self._ready_pipeline()
        job = parse_score(self._json(body), self.limits)
        scores, num_tokens = await pipeline.score(job)
        self._count(num_tokens, job.num_documents)
        return 200, JSON, dumps(score_body(scores, self.model_name, num_tokens))

    async def tokenize(self, body: bytes) -> tuple[int, bytes, bytes]:
        pipeline = self._ready_pipeline()
        texts, options = parse_tokenize(self._json(body), self.limits, pipeline.inputs)
        tokens = await pipeline.tokenize(texts, options)
        count = sum(map(len, tokens))
        return (
            200,
            JSON,
            dumps(
                {
                    "model": self.model_name,
                    "tokens": tokens,
                    "num_tokens": [len(t) for t in tokens],
                    "usage": {"prompt_tokens": count, "total_tokens": count},
                }
            ),
        )

    async def models(self, body: bytes) -> tuple[int, bytes, bytes]:
        model = {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "embedserve",
            # what the model does here: "embed" (embeddings, and rerank by cosine) or "score"
            # (a reranker: /v1/rerank, /rerank and /v1/score only), and how it scores
            "task": self.limits.task,
            "scoring": self.limits.scoring,
        }
        return 200, JSON, dumps({"object": "list", "data": [model]})

    async def health(self, body: bytes) -> tuple[int, bytes, bytes]:
        return 200, JSON, b'{"status":"ok"}'

    async def ready(self, body: bytes) -> tuple[int, bytes, bytes]:
        pool = self._ready_pipeline().replicas
        # by id, never by address: internal addresses stay out of client answers
        replicas = [
            {"replica": r.id, "healthy": r.healthy, "outstanding_tokens": r.outstanding_tokens}
            for r in pool.replicas
        ]
        if pool.num_healthy == 0:
            error = ApiError(503, "no healthy server replica", code="no_healthy_replica")
            return 503, JSON, dumps({**error.body(), "replicas": replicas})
        return 200, JSON, dumps({"status": "ready", "replicas": replicas})

    async def prometheus(self, body: bytes) -> tuple[int, bytes, bytes]:
        if self.pipeline is not None:
            # by address: the same server in every worker (an index named different ones)
            replicas = self.pipeline.replicas.replicas
            for address in self._labelled - {r.address for r in replicas}:  # dropped: its series go
                for gauge in (self.metrics.healthy, self.metrics.outstanding):
                    gauge.labels(address).set(0)  # NOTE: a worker's file keeps it (multiprocess)
                    gauge.remove(address)
            self._labelled = {r.address for r in replicas}
            for r in replicas:
                self.metrics.healthy.labels(r.address).set(float(r.healthy))
                self.metrics.outstanding.labels(r.address).set(r.outstanding_tokens)
        registry = self.metrics.registry
        if os.environ.get(MULTIPROCESS_DIR):  # several workers: add up every worker's files
            registry = prom.CollectorRegistry()
            MultiProcessCollector(registry)
        payload = prom.generate_latest(registry)
        return 200, prom.CONTENT_TYPE_LATEST.encode(), payload

    async def openapi(self, body: bytes) -> tuple[int, bytes, bytes]:
        return 200, JSON, self._openapi


def _request_id(headers: dict[bytes, bytes]) -> bytes:
    """The client's X-Request-Id when it is short and printable, else a new one."""
    value = headers.get(b"x-request-id", b"")
    if 0 < len(value) <= REQUEST_ID_MAX and all(33 <= c < 127 for c in value):
        return bytes(value)
    return uuid.uuid4().hex.encode()
