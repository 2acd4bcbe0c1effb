"""text-embeddings-inference's gRPC API (`contract/tei.proto`) on `--tei-grpc-port`.

Each gateway worker serves it from its own event loop, on the port every worker binds
(SO_REUSEPORT: the kernel spreads the connections, as it does the HTTP port's). A call is read
into the body of TEI's HTTP route of the same name and goes through that route's parser and the
model's `Pipeline` (`gateway.tei`, `scoring`, `classify`): one request core, one set of
messages. Streams answer in request order, up to `STREAM_WINDOW` requests of a stream in flight.

Errors: `ApiError` / `InputError` map to gRPC codes by HTTP status (`STATUS_CODES`), a route of
another task to FAILED_PRECONDITION (as TEI answers); the API keys, the drain and the metrics are
the HTTP routes'. The sparse RPCs go through `/embed_sparse`'s parser (`gateway.output_bodies`)
to a model with a sparse output.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from embedserve.contract import tei as proto
from embedserve.core.inputs import InputError
from embedserve.gateway import output_bodies, tei
from embedserve.gateway.checks import authenticate, request_id
from embedserve.gateway.classify import parse_predict
from embedserve.gateway.errors import REQUEST_ID, ApiError, bad_request, from_input_error
from embedserve.gateway.models import ANY, CLASSIFY, EMBED, SCORE, ServedModel
from embedserve.gateway.replicas import REPLICAS_CALLED
from embedserve.gateway.result_cache import set_tenant
from embedserve.gateway.scoring import parse_tei_rerank, tei_rerank_body

if TYPE_CHECKING:
    from embedserve.gateway.app import GatewayApp

log = logging.getLogger("embedserve.gateway.tei_grpc")
STOP_GRACE_SECONDS = 1.0  # for calls still running at shutdown (the drain has waited for them)
STREAM_WINDOW = 64  # requests of one stream in flight at once (their answers wait their turn)
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
DIRECTIONS = {0: "Right", 1: "Left"}  # tei.v1.TruncationDirection
MODEL_TYPES = {"embed": "MODEL_TYPE_EMBEDDING", "score": "MODEL_TYPE_RERANKER",
               "classify": "MODEL_TYPE_CLASSIFIER"}  # fmt: skip
Unary = Callable[[Any], Awaitable[Any]]


def status_code(error: ApiError) -> grpc.StatusCode:
    if error.code == "wrong_model_task":
        return grpc.StatusCode.FAILED_PRECONDITION
    return STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL)


def body_of(request: Any) -> dict[str, Any]:
    """A request message as the JSON body of TEI's HTTP route: every field but an unset
    `optional` one (absent, so the route's default applies), directions by name. NOTE: a plain
    proto3 field is always "sent" (an empty `inputs` is an empty string, as over HTTP)."""
    body: dict[str, Any] = {}
    for field in request.DESCRIPTOR.fields:
        if field.has_presence and not request.HasField(field.name):
            continue
        value = getattr(request, field.name)
        # NOTE: `is_repeated` in protobuf 6+ (where `label` went), `label` before
        repeated = getattr(field, "is_repeated", None)
        if repeated is None:
            repeated = field.label == field.LABEL_REPEATED
        body[field.name] = list(value) if repeated else value
    if "truncation_direction" in body:
        body["truncation_direction"] = DIRECTIONS[body["truncation_direction"]]
    return body


class TeiGrpc:
    """The gRPC server of one worker, on its `GatewayApp` (`start` after the app's pipelines,
    `stop` before they close)."""

    def __init__(self, app: GatewayApp, host: str, port: int) -> None:
        self.app, self.address = app, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.server: grpc.aio.Server | None = None
        self.unary: dict[str, Unary] = {
            "Info": self.info,
            "Embed": self.embed,
            "EmbedAll": self.embed_all,
            "EmbedSparse": self.embed_sparse,
            "Predict": self.predict,
            "PredictPair": self.predict_pair,
            "Rerank": self.rerank,
            "Tokenize": self.tokenize,
            "Decode": self.decode,
        }

    async def start(self) -> None:
        limit = self.app.max_body_bytes
        self.server = grpc.aio.server(
            options=[("grpc.so_reuseport", 1), ("grpc.max_receive_message_length", limit)]
        )
        self.server.add_generic_rpc_handlers(self.handlers())
        if self.server.add_insecure_port(self.address) == 0:
            raise RuntimeError(f"cannot listen for TEI's gRPC API on {self.address}")
        await self.server.start()

    async def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        if self.server is not None:
            await self.server.stop(grace)

    def handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        """One generic handler per service of tei.proto, every method it declares."""
        by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = collections.defaultdict(dict)
        for m in proto.METHODS:
            codec = {
                "request_deserializer": proto.message(m.request).FromString,
                "response_serializer": proto.message(m.response).SerializeToString,
            }
            if not m.client_streaming:
                handler = grpc.unary_unary_rpc_method_handler(
                    self._call(m, self.unary[m.name]), **codec
                )
            elif m.server_streaming:  # EmbedStream, ...: the unary method of the stem, in order
                handler = grpc.stream_stream_rpc_method_handler(
                    self._stream(m, self.unary[m.name.removesuffix("Stream")]), **codec
                )
            else:  # RerankStream: many texts, one answer
                handler = grpc.stream_unary_rpc_method_handler(
                    self._call(m, self.rerank_stream), **codec
                )
            by_service[m.service][m.name] = handler
        return tuple(
            grpc.method_handlers_generic_handler(f"{proto.PACKAGE}.{service}", methods)
            for service, methods in by_service.items()
        )

    # -- the call around each method: keys, drain, errors, metrics ---------------------------

    def _enter(self, context: grpc.aio.ServicerContext) -> None:
        headers = {
            k.encode(): v.encode()
            for k, v in context.invocation_metadata() or ()
            if isinstance(v, str)
        }
        REQUEST_ID.set(request_id(headers).decode("ascii"))
        REPLICAS_CALLED.set(set())
        set_tenant(authenticate(headers, self.app.api_keys()))
        if self.app.draining:
            raise ApiError(503, "the gateway is shutting down", code="shutting_down")

    async def _guarded(
        self, m: proto.Method, context: Any, work: Callable[[], Awaitable[Any]]
    ) -> Any:
        start, status = time.perf_counter(), 200
        self.app.in_flight += 1  # the drain waits for calls as for HTTP requests
        try:
            self._enter(context)
            return await work()
        except (ApiError, InputError) as e:
            error = e if isinstance(e, ApiError) else from_input_error(e)
            status = error.status
            await context.abort(status_code(error), error.message)
        except asyncio.CancelledError:
            status = 499
            raise
        except Exception:
            log.exception("unhandled error on %s", m.path)
            status = 500
            await context.abort(grpc.StatusCode.INTERNAL, "internal error in the gateway")
        finally:
            self.app.in_flight -= 1
            count, latency = self.app.metrics.route(m.path, status)
            count.inc()
            latency.observe(time.perf_counter() - start)

    def _call(self, m: proto.Method, fn: Unary) -> Callable[[Any, Any], Awaitable[Any]]:
        async def call(request: Any, context: Any) -> Any:
            return await self._guarded(m, context, lambda: fn(request))

        return call

    def _stream(self, m: proto.Method, fn: Unary) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def call(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            pending: collections.deque[asyncio.Future[Any]] = collections.deque()
            try:
                async for request in requests:
                    pending.append(
                        asyncio.ensure_future(
                            self._guarded(m, context, functools.partial(fn, request))
                        )
                    )
                    while pending and (len(pending) >= STREAM_WINDOW or pending[0].done()):
                        yield await pending.popleft()
                while pending:
                    yield await pending.popleft()
            finally:
                for task in pending:
                    task.cancel()

        return call

    # -- the methods: TEI's HTTP route bodies, through the same parsers and pipelines ---------

    def _model(self, task: str) -> tuple[ServedModel, Any]:
        model = self.app.served.pick(None, task)  # several models: a 400 naming them
        return model, model.started()

    @staticmethod
    def _metadata(body: dict[str, Any], num_tokens: int, start: float) -> Any:
        chars = sum(len(x) for x in (body.get("inputs") or ()) if isinstance(x, str))
        if isinstance(body.get("inputs"), str):
            chars = len(body["inputs"])
        return proto.message("Metadata")(
            compute_chars=chars,
            compute_tokens=num_tokens,
            total_time_ns=int((time.perf_counter() - start) * 1e9),
        )

    async def info(self, request: Any) -> Any:
        model, _ = self._model(ANY)
        facts = self.app.dropin.info_of(model)
        return proto.message("InfoResponse")(
            version=facts["version"],
            model_id=facts["model_id"],
            model_dtype=facts["model_dtype"],
            model_type=proto.enum_value("ModelType", MODEL_TYPES[model.limits.task]),
            max_input_length=facts["max_input_length"],
            max_batch_tokens=facts["max_batch_tokens"],
            max_client_batch_size=facts["max_client_batch_size"],
            tokenization_workers=facts["tokenization_workers"],
        )

    async def embed(self, request: Any) -> Any:
        start, body = time.perf_counter(), body_of(request)
        model, pipeline = self._model(EMBED)
        vectors, num_tokens = await pipeline.embed(
            tei.parse_embed(body, model.limits, pipeline.inputs)
        )
        self.app.metrics.count(num_tokens, 1)
        return proto.message("EmbedResponse")(
            embeddings=vectors[0].tolist(), metadata=self._metadata(body, num_tokens, start)
        )

    async def embed_all(self, request: Any) -> Any:
        start, body = time.perf_counter(), body_of(request)
        model, pipeline = self._model(EMBED)
        job = tei.parse_embed_all(body, model.limits, pipeline.inputs)
        states, num_tokens = await pipeline.token_states(job, model.limits.max_multivector_values)
        self.app.metrics.count(num_tokens, 1)
        rows = [proto.message("TokenEmbedding")(embeddings=row) for row in states[0].tolist()]
        return proto.message("EmbedAllResponse")(
            token_embeddings=rows, metadata=self._metadata(body, num_tokens, start)
        )

    async def embed_sparse(self, request: Any) -> Any:
        """TEI's EmbedSparse through `/embed_sparse`'s parser and the pipeline's outputs call
        (`gateway.output_bodies`): a model with a sparse output (SPLADE, bge-m3), else a 400-like
        INVALID_ARGUMENT naming the outputs the served model has."""
        start, body = time.perf_counter(), body_of(request)
        model = self.app.served.pick(None, EMBED, ("sparse",))
        pipeline = model.started()
        job = output_bodies.parse_embed_sparse(body, model.limits, pipeline.inputs.head())
        encoded, num_tokens = await pipeline.outputs(job, model.limits)
        self.app.metrics.count(num_tokens, 1)
        (row,) = output_bodies.tei_sparse_body(encoded)
        sparse = [proto.message("SparseValue")(index=e["index"], value=e["value"]) for e in row]
        return proto.message("EmbedSparseResponse")(
            sparse_embeddings=sparse, metadata=self._metadata(body, num_tokens, start)
        )

    async def predict(self, request: Any) -> Any:
        start, body = time.perf_counter(), body_of(request)
        model, pipeline = self._model(CLASSIFY)
        routes = self.app.classify
        preparer = routes.preparer(model.name, pipeline)
        job = parse_predict(body, model.limits)
        scores, num_tokens = await routes.scores(preparer, pipeline, job)
        (row,) = preparer.predictions(scores, job.top_k)
        predictions = [proto.message("Prediction")(score=p.score, label=p.label) for p in row]
        return proto.message("PredictResponse")(
            predictions=predictions, metadata=self._metadata(body, num_tokens, start)
        )

    async def predict_pair(self, request: Any) -> Any:
        if len(request.inputs) != 2:
            raise bad_request(
                f"PredictPairRequest.inputs holds {len(request.inputs)} texts; a pair is two",
                param="inputs",
            )
        return await self.predict(request)

    async def rerank(self, request: Any) -> Any:
        start, body = time.perf_counter(), body_of(request)
        model, pipeline = self._model(SCORE)
        job, return_text = parse_tei_rerank(body, model.limits)
        scores, num_tokens = await pipeline.score(job)
        self.app.metrics.count(num_tokens, job.num_documents)
        ranks = [
            proto.message("Rank")(**rank)
            for rank in tei_rerank_body(scores, job.groups[0][1], return_text)
        ]
        metadata = self._metadata(
            {"inputs": [body.get("query", ""), *body.get("texts", ())]}, num_tokens, start
        )
        return proto.message("RerankResponse")(ranks=ranks, metadata=metadata)

    async def rerank_stream(self, requests: AsyncIterator[Any]) -> Any:
        """The first message's query and options, every message's text. NOTE: the texts are
        counted as they come, in number (the model's `max_inputs`) and characters (the body
        bound an HTTP request has): an endless stream was kept whole before any limit."""
        model, _ = self._model(SCORE)
        max_texts, max_chars = model.limits.max_inputs, self.app.max_body_bytes
        first, texts, num_chars = None, [], 0
        async for request in requests:
            first = first or request
            texts.append(request.text)
            num_chars += len(request.text) + len(request.query)
            if len(texts) > max_texts:
                raise bad_request(
                    f"RerankStream sent over {max_texts} texts, the limit per request",
                    param="texts",
                    code="too_many_inputs",
                )
            if num_chars > max_chars:
                raise bad_request(
                    f"RerankStream sent over {max_chars} characters, the limit per request",
                    param="texts",
                    code="body_too_large",
                )
        if first is None:
            raise bad_request("RerankStream got no message; send one per text", param="texts")
        whole = proto.message("RerankRequest")(
            query=first.query,
            texts=texts,
            truncate=first.truncate,
            raw_scores=first.raw_scores,
            return_text=first.return_text,
            truncation_direction=first.truncation_direction,
        )
        return await self.rerank(whole)

    async def tokenize(self, request: Any) -> Any:
        """The core's tokenizer on the prompt and the text, with TEI's per-token view."""
        _, pipeline = self._model(ANY)
        inputs = pipeline.inputs
        body = body_of(request)
        texts, _ = inputs.read_inputs(body.get("inputs", ""))
        text = inputs.prompt(prompt_name=body.get("prompt_name")) + texts[0]
        (encoding,) = await pipeline._off_loop(
            len(text), lambda: inputs.tokenizer.encode_with_offsets([text])
        )
        pipeline._check_size(len(encoding.ids))
        tokens = []
        for token_id, piece, special, (begin, end) in zip(
            encoding.ids,
            encoding.tokens,
            encoding.special_tokens_mask,
            encoding.offsets,
            strict=True,
        ):
            if special and not request.add_special_tokens:
                continue
            span = {} if special else {"start": begin, "stop": end}
            shown = piece if special else text[begin:end]
            tokens.append(
                proto.message("SimpleToken")(id=token_id, text=shown, special=bool(special), **span)
            )
        return proto.message("EncodeResponse")(tokens=tokens)

    async def decode(self, request: Any) -> Any:
        _, pipeline = self._model(ANY)
        batch, skip = tei.parse_decode(body_of(request), pipeline.inputs.vocab_size)
        (text,) = tei.decode(pipeline.inputs.spec.path, batch, skip)
        return proto.message("DecodeResponse")(text=text)
