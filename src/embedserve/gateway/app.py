"""The HTTP API as a raw ASGI app: the routes and their handlers, and the loop every request
goes through (checks, body, handler, errors, answer, metrics).

No web framework: one dict of routes and a handful of helpers, which is both what the GPU
machine can run (it has no FastAPI) and the least work per request. The checks before a handler
are in `checks`, the body and disconnects in `transport`, the metrics and log line in `metrics`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from embedserve.contract import tracing
from embedserve.core.inputs import InputError
from embedserve.gateway.bodies import contextual_body, embeddings_body
from embedserve.gateway.checks import (
    authenticate,
    check_content_type,
    check_headers,
    check_host,
    no_route,
    request_id,
)
from embedserve.gateway.classify import ClassifyRoutes
from embedserve.gateway.dropin import TEI_ROUTES, DropInRoutes, Headers
from embedserve.gateway.errors import REQUEST_ID, ApiError, from_input_error
from embedserve.gateway.jsonio import dumps
from embedserve.gateway.metrics import MULTIPROCESS_DIR as MULTIPROCESS_DIR  # gateway.main's
from embedserve.gateway.metrics import (
    GaugeRefresh,
    Metrics,
    log_request,
    set_request_model,
    track_request,
)
from embedserve.gateway.models import ANY, EMBED, SCORE, ServedModel, ServedModels
from embedserve.gateway.openapi_dropin import api_document
from embedserve.gateway.output_bodies import asked_outputs, outputs_body, parse_outputs
from embedserve.gateway.pipeline import Pipeline
from embedserve.gateway.probes import Probes
from embedserve.gateway.replicas import REPLICAS_CALLED
from embedserve.gateway.requests import (
    MAX_TOKENS_PER_REQUEST,
    Limits,
    embeddings_head,
    parse_contextual,
    parse_embeddings,
    parse_tokenize,
    tokenize_body,
)
from embedserve.gateway.result_cache import set_tenant
from embedserve.gateway.scoring import (
    parse_rerank,
    parse_score,
    parse_tei_rerank,
    rerank_body,
    score_body,
    tei_rerank_body,
)
from embedserve.gateway.stalls import LoopWatch
from embedserve.gateway.timing import timing_headers, track_times
from embedserve.gateway.transport import (
    RETRY_AFTER_SECONDS,
    Answer,
    ClientGone,
    Receive,
    Scope,
    Send,
    max_json_strings,
    max_json_values,
    parse_json,
    read_body,
    send_answer,
    unless_disconnected,
)

log = logging.getLogger("embedserve.gateway")
BODY_TIMEOUT = 30.0  # s for a body to arrive after its headers (`--body-timeout`)

Handler = Callable[[bytes], Awaitable[Answer]]

JSON = b"application/json"
# NOTE: the routes a kubelet or load balancer probes: it sends the pod's IP as Host and no key,
# so these answer every Host without a key (`/ready` then with its status only, see `ready`)
PROBE_PATHS = frozenset({"/health", "/ready"})


class GatewayApp:
    """`await app(scope, receive, send)`; each model's pipeline is built at lifespan startup."""

    def __init__(
        self,
        make_pipeline: Callable[[], Pipeline] | ServedModels,
        limits: Limits | None = None,
        *,
        max_body_bytes: int,
        body_timeout: float = BODY_TIMEOUT,
        api_keys: Callable[[], frozenset[bytes]] = frozenset,
        metrics_open: bool = False,
        allowed_hosts: frozenset[str] = frozenset(),
        log_requests: bool = False,
    ) -> None:
        """`api_keys`: the keys a client must send as `Authorization: Bearer <key>` (read on
        every request, so a reload takes effect at once; empty: no authentication).
        `allowed_hosts`: the Host header values (without port) served; empty: any.
        One model: `make_pipeline` and its `limits`; several: a `ServedModels`."""
        if isinstance(make_pipeline, ServedModels):
            self.served = make_pipeline
        else:
            assert limits is not None, "one model's pipeline comes with its limits"
            self.served = ServedModels([ServedModel(limits, make_pipeline)])
        limits = self.served.first.limits  # the default model's (`--default-model`), else the first
        self.allowed_hosts = allowed_hosts
        self.log_requests = log_requests
        self.api_keys = api_keys
        # routes open without a key (the probes aside): none, /metrics with `metrics_open`;
        # every other route needs the key, /metrics included by default (issue 40)
        self.open_paths = {"/metrics"} if metrics_open else set()
        self.limits = limits
        self.max_json_strings = max(max_json_strings(m.limits) for m in self.served.models)
        self.max_json_values = max(
            max_json_values(m.limits, m.max_tokens_per_request or MAX_TOKENS_PER_REQUEST)
            for m in self.served.models
        )
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout  # s for a body to arrive after its headers
        self.model_name = limits.model_names[0]
        self.metrics = Metrics(model_label=self.served.several)
        self.probes = Probes(self.served, self.metrics)  # /health, /ready, /metrics
        # set on SIGTERM (gateway.main.DrainingServer): every new request but /health gets 503
        # at once while the ones in flight (counted here) finish
        self.draining = False
        self.in_flight = 0
        # /predict (TEI) and /classify (vLLM); TEI's gRPC Predict calls it too
        self.classify = ClassifyRoutes(self)
        # what else runs on the worker's loop (the stall watch, TEI's gRPC API): `start()`
        # once the pipelines are up, `stop()` before they close
        self.services: list[Any] = [
            LoopWatch(self.metrics.loop_lag, self.metrics.gc_pause),
            GaugeRefresh(self.metrics, self.probes.replica_labels),
        ]
        self._add_routes()
        every_name = tuple(n for m in self.served.models for n in m.limits.model_names)
        # the schema lists every model's names and outputs (the first model's other limits)
        every_output = tuple(dict.fromkeys(o for m in self.served.models for o in m.limits.outputs))
        schema_limits = dataclasses.replace(limits, model_names=every_name, outputs=every_output)
        names = ", ".join(self.served.names())
        self._openapi = dumps(api_document(names, schema_limits, self.routes))

    def _add_routes(self) -> None:
        """The route table (`routes`: ours, then the drop-in APIs'), its paths, and the handlers
        whose work a client's disconnect cancels."""
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
            ("POST", "/predict"): self.classify.predict,
            ("POST", "/classify"): self.classify.classify,
            ("GET", "/health"): self.probes.health,
            ("GET", "/ready"): self.probes.ready,
            ("GET", "/metrics"): self.probes.prometheus,
            ("GET", "/openapi.json"): self.openapi,
        }
        # TEI's other routes, Cohere's v2, the API page (`gateway.dropin`)
        self.dropin = DropInRoutes(self, self.tei_rerank)
        self.routes.update(self.dropin.routes)
        self.paths = {path for _, path in self.routes}
        # the work a client's disconnect cancels (with its server calls)
        self.cancellable = {
            self.embeddings,
            self.contextualized,
            self.rerank,
            self.tei_rerank,
            self.score,
            self.classify.predict,
            self.classify.classify,
            *self.dropin.cancellable,
        }

    @property
    def pipeline(self) -> Pipeline | None:
        """The first (with one model: the) model's pipeline."""
        return self.served.models[0].pipeline

    @pipeline.setter
    def pipeline(self, pipeline: Pipeline | None) -> None:
        self.served.models[0].pipeline = pipeline

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
                    for m in self.served.models:
                        m.pipeline = m.make_pipeline()
                        m.pipeline.calls.on_merged = self.metrics.merged(m.name)
                        if m.pipeline.cache.enabled:
                            m.pipeline.cache.stats = self.metrics.cache(m.name)
                        await m.pipeline.replicas.start()
                    for service in self.services:
                        await service.start()
                except Exception as e:
                    log.exception("gateway startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for service in self.services:  # uvicorn has drained the HTTP requests
                    await service.stop()
                for m in self.served.models:
                    if m.pipeline is not None:
                        await m.pipeline.replicas.close()
                        m.pipeline.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.in_flight += 1
        try:
            await self._http(scope, receive, send)
        except asyncio.CancelledError:
            # cut by the drain deadline (uvicorn cancels what is left): say so in JSON, where
            # uvicorn answers a plain-text 500
            if not self.draining or not await self._cut_short(send):
                raise
        finally:
            self.in_flight -= 1

    async def _cut_short(self, send: Send) -> bool:
        """A 503 `shutting_down` for a request cut by the drain; False if its answer had begun
        (uvicorn then refuses a second start)."""
        error = ApiError(
            503, "the gateway shut down before the answer was ready", code="shutting_down"
        )
        payload = self._error_body(False, error)
        headers = [(b"content-type", JSON), (b"content-length", str(len(payload)).encode()),
                   (b"retry-after", RETRY_AFTER_SECONDS), (b"connection", b"close")]  # fmt: skip
        try:
            await send({"type": "http.response.start", "status": 503, "headers": headers})
        except RuntimeError:
            return False
        await send({"type": "http.response.body", "body": payload})
        return True

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One request: its context (id, span, counters), its answer, then the answer sent and
        recorded; a client gone before its answer is counted as 499."""
        start = time.perf_counter()
        method, path = scope["method"], scope["path"]
        route = path if path in self.paths else "other"
        headers_in = dict(scope["headers"])  # read once: the checks all look in it
        answer_id = request_id(headers_in)
        REQUEST_ID.set(answer_id.decode("ascii"))  # a server failure's answer names it
        span = None
        if tracing.TRACER is not None:  # --otlp-endpoint: this request's span
            span = tracing.gateway_span(headers_in, answer_id.decode("ascii"), method, route)
        counts = track_request()
        times = track_times()  # TEI's timing headers (`gateway.timing`)
        replicas: set[int] = set()
        REPLICAS_CALLED.set(replicas)
        set_request_model("")
        try:
            status, content_type, payload, extra = await self._answer(
                scope, receive, headers_in, times, start
            )
        except ClientGone:  # nobody to answer: counted, and logged as the ordinary event it is
            log.info("%s %s: the client disconnected before its answer", method, route)
            self.metrics.requests.labels(route, "499").inc()
            status = 499
        else:
            headers = ((b"x-request-id", answer_id), *extra)
            await send_answer(send, status, content_type, payload, headers)
            count, latency = self.metrics.route(route, status)
            count.inc()
            latency.observe(time.perf_counter() - start)
        tracing.end_gateway_span(span, status)
        if self.log_requests:
            seconds = time.perf_counter() - start
            log_request(answer_id, method, route, status, seconds, counts, replicas)

    async def _answer(self, scope: Scope, receive: Receive, headers_in: dict[bytes, bytes],
                      times: Any, start: float) -> tuple[int, bytes, bytes, Headers]:  # fmt: skip
        """(status, content type, payload, extra headers): the handler's answer once the checks
        pass, with TEI's timing headers (`times`, since `start`), else the error's (TEI's shape
        on a TEI route past the checks)."""
        method, path = scope["method"], scope["path"]
        tei_errors = False  # a TEI route's own errors (past the checks) answer TEI's shape
        try:
            handler, body, admitted = await self._checked(scope, receive, headers_in)
            tei_errors = (method, path) in TEI_ROUTES
            if handler in self.cancellable:
                status, content_type, payload = await unless_disconnected(handler(body), receive)
            elif path == "/ready":
                status, content_type, payload = await self.probes.ready(body, detailed=admitted)
            else:
                status, content_type, payload = await handler(body)
            extra = self.dropin.headers.get((method, path), ())
            extra += timing_headers(times, time.perf_counter() - start)
            return status, content_type, payload, extra
        except ApiError as e:
            return e.status, JSON, self._error_body(tei_errors, e), e.headers
        except InputError as e:  # the request core's: the same message as the offline API's
            return 400, JSON, self._error_body(tei_errors, from_input_error(e)), ()
        except ClientGone:
            raise
        except Exception:
            log.exception("unhandled error on %s %s", method, path)
            error = ApiError(500, "internal error in the gateway", code="server_error")
            return 500, JSON, self._error_body(tei_errors, error), ()

    async def _checked(
        self, scope: Scope, receive: Receive, headers_in: dict[bytes, bytes]
    ) -> tuple[Handler, bytes, bool]:
        """The route's handler, the body and whether the Host and key checks passed, once the
        checks before a handler pass (they raise the `ApiError` of the first that fails)."""
        method, path = scope["method"], scope["path"]
        check_headers(scope["headers"], headers_in)  # two Hosts: before the Host is read
        admitted = self._admit(path, headers_in)
        if self.draining and path != "/health":
            raise ApiError(503, "the gateway is shutting down", code="shutting_down")
        handler = self.routes.get((method, path))
        if handler is None:
            raise self._no_route(method, path)
        body = b""
        if method == "POST":
            check_content_type(headers_in)
            body = await read_body(scope, receive, self.max_body_bytes, self.body_timeout)
        return handler, body, admitted

    def _no_route(self, method: str, path: str) -> ApiError:
        error = no_route(method, path, self.routes)
        if error.status == 404:  # a new user's first wrong guess: where the routes are listed
            error.message += "; every route is listed at /docs and in /openapi.json"
        return error

    @staticmethod
    def _error_body(tei: bool, error: ApiError) -> bytes:
        """The OpenAI shape, or TEI's for a TEI route's own errors (its clients read `error` as
        a string). NOTE: the checks before a handler (Host, key, route, Content-Type, body
        size) answer the OpenAI shape on every route, as they always have."""
        return dumps(error.tei_body() if tei else error.body())

    def _admit(self, path: str, headers: dict[bytes, bytes]) -> bool:
        """Whether the request passes the Host and API key checks; else the `ApiError` of the
        first it fails, but on a probe route, which answers anyway (False: with less)."""
        try:
            if self.allowed_hosts:
                check_host(headers, self.allowed_hosts)
            key = b"" if path in self.open_paths else authenticate(headers, self.api_keys())
        except ApiError:
            if path in PROBE_PATHS:
                return False
            raise
        set_tenant(key)  # whose results the result cache may answer with
        return True

    def served_for(
        self, body: bytes, task: str, outputs: Callable[[Any], Any] | None = None
    ) -> tuple[str, Limits, Pipeline, Any]:
        """The request's model (its name, limits and pipeline) for a route of `task`, and its
        parsed body (`gateway.models`: which model a request goes to); `outputs` reads what
        an embedding route's body asks for (default: dense vectors)."""
        if not self.served.several:  # the checks in a single-model gateway's order
            pipeline = self.served.models[0].started()
            data = parse_json(body, self.max_json_strings, self.max_json_values)
            chosen = self.served.pick(None, task, outputs(data) if outputs else None)
        else:
            data = parse_json(body, self.max_json_strings, self.max_json_values)
            chosen = self.served.pick(data, task, outputs(data) if outputs else None)
            pipeline = chosen.started()
            set_request_model(chosen.name)
        return chosen.name, chosen.limits, pipeline, data

    async def embeddings(self, body: bytes) -> Answer:
        name, limits, pipeline, data = self.served_for(body, EMBED, asked_outputs)
        outputs = asked_outputs(data)
        if outputs is not None and limits.retrieval is not None:  # `gateway.output_bodies`
            head, encoding_format = embeddings_head(data, pipeline.inputs)
            asked = parse_outputs(data, limits, head, encoding_format, outputs)
            encoded, num_tokens = await pipeline.outputs(asked, limits)
            self.metrics.count(num_tokens, len(encoded))
            return 200, JSON, dumps(outputs_body(encoded, asked, name, num_tokens))
        job = parse_embeddings(data, limits, pipeline.inputs)
        vectors, num_tokens = await pipeline.embed(job)
        self.metrics.count(num_tokens, len(vectors))
        return 200, JSON, dumps(embeddings_body(vectors, job.encoding_format, name, num_tokens))

    async def contextualized(self, body: bytes) -> Answer:
        name, limits, pipeline, data = self.served_for(body, EMBED)
        job = parse_contextual(data, limits, pipeline.inputs)
        documents, num_tokens = await pipeline.contextual(job)
        self.metrics.count(num_tokens, job.num_chunks)
        return 200, JSON, dumps(contextual_body(documents, job.encoding_format, name, num_tokens))

    async def rerank(self, body: bytes) -> Answer:
        name, limits, pipeline, data = self.served_for(body, SCORE)
        job, top_n, return_documents = parse_rerank(data, limits)
        scores, num_tokens = await pipeline.score(job)
        self.metrics.count(num_tokens, job.num_documents)
        docs = job.groups[0][1]
        return (
            200,
            JSON,
            dumps(rerank_body(scores, docs, top_n, return_documents, name, num_tokens)),
        )

    async def tei_rerank(self, body: bytes) -> Answer:
        _, limits, pipeline, data = self.served_for(body, SCORE)
        job, return_text = parse_tei_rerank(data, limits)
        scores, num_tokens = await pipeline.score(job)
        self.metrics.count(num_tokens, job.num_documents)
        return 200, JSON, dumps(tei_rerank_body(scores, job.groups[0][1], return_text))

    async def score(self, body: bytes) -> Answer:
        name, limits, pipeline, data = self.served_for(body, SCORE)
        job = parse_score(data, limits)
        scores, num_tokens = await pipeline.score(job)
        self.metrics.count(num_tokens, job.num_documents)
        return 200, JSON, dumps(score_body(scores, name, num_tokens))

    async def tokenize(self, body: bytes) -> Answer:
        name, limits, pipeline, data = self.served_for(body, ANY)
        texts, options = parse_tokenize(data, limits, pipeline.inputs)
        tokens = await pipeline.tokenize(texts, options)
        return 200, JSON, dumps(tokenize_body(tokens, name))

    async def models(self, body: bytes) -> Answer:
        data = [m.describe() for m in self.served.models]
        return 200, JSON, dumps({"object": "list", "data": data})

    async def openapi(self, body: bytes) -> Answer:
        return 200, JSON, self._openapi
