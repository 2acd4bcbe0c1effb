"""The handlers of the drop-in APIs: text-embeddings-inference's routes, Cohere's v2 and the API
page. The app (`gateway.app`) merges `DropInRoutes.routes` into its table and runs them through
the same checks, body reading, cancellation and metrics as its own.

On TEI's routes an error answers TEI's shape (`TEI_ROUTES`, `ApiError.tei_body`). `POST /` is
TEI's route for the model's task, looked up in `ROOT_TASKS` by the model's task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from embedserve.gateway import cohere, output_bodies, tei
from embedserve.gateway.docs_page import CONTENT_SECURITY_POLICY, HTML, docs_html
from embedserve.gateway.errors import ApiError, bad_request
from embedserve.gateway.jsonio import dumps
from embedserve.gateway.models import ANY, DEFAULT_TASKS, EMBED, SCORE, ServedModel
from embedserve.gateway.transport import Answer, parse_json

if TYPE_CHECKING:
    from embedserve.gateway.context import RouteContext

JSON = b"application/json"
Headers = tuple[tuple[bytes, bytes], ...]
Handler = Callable[[bytes], Awaitable[Answer]]
# TEI's routes: their errors answer `{"error", "error_type"}`. NOTE: `/rerank` keeps the OpenAI
# error shape it has always answered (its clients already read it)
TEI_ROUTES = frozenset(
    {("POST", p) for p in ("/", "/embed", "/embed_all", "/embed_sparse", "/similarity", "/decode")}
    | {("GET", "/info")}
)
# the API page's headers
PAGE_HEADERS: Headers = ((b"content-security-policy", CONTENT_SECURITY_POLICY),)


class DropInRoutes:
    def __init__(self, app: RouteContext, rerank: Handler) -> None:
        self.app = app
        # `POST /` per model task (`Limits.task`); a new task adds its handler here
        self.root_tasks: dict[str, Handler] = {"embed": self.root_embed, "score": rerank}
        self.routes: dict[tuple[str, str], Handler] = {
            ("POST", "/"): self.root,
            ("POST", "/embed"): self.embed,
            ("POST", "/embed_all"): self.embed_all,
            ("POST", "/embed_sparse"): self.embed_sparse,
            ("POST", "/similarity"): self.similarity,
            ("POST", "/decode"): self.decode,
            ("GET", "/info"): self.info,
            ("POST", "/v2/embed"): self.cohere_embed,
            ("POST", "/v2/rerank"): self.cohere_rerank,
            ("GET", "/docs"): self.docs,
            ("GET", "/redoc"): self.docs,
            ("GET", "/"): self.not_a_page,
        }
        # the work a client's disconnect cancels
        self.cancellable = {
            self.root,
            self.embed,
            self.embed_all,
            self.embed_sparse,
            self.similarity,
            self.cohere_embed,
            self.cohere_rerank,
        }
        # the headers some answers add: the page's policy
        self.headers: dict[tuple[str, str], Headers] = {
            ("GET", "/docs"): PAGE_HEADERS,
            ("GET", "/redoc"): PAGE_HEADERS,
        }

    def _json(self, body: bytes) -> object:
        return parse_json(body, self.app.max_json_strings, self.app.max_json_values)

    async def root(self, body: bytes) -> Answer:
        served = self.app.served
        # the body's model where it names one served here (several models: an embed body for an
        # embedder must not land in the reranker's parser); else the default model's
        data = self._json(body) if served.several else None
        asked = data.get("model") if isinstance(data, dict) else None
        named = served.by_name.get(asked) if isinstance(asked, str) else None
        task = named.limits.task if named is not None else None
        task = task or served.first.limits.task  # `--default-model`'s
        handler = self.root_tasks.get(task)
        if handler is None:
            raise bad_request(
                f"POST / has no route for this model's task {task!r}",
                param="model",
                code="wrong_model_task",
            )
        return await handler(body)

    async def root_embed(self, body: bytes) -> Answer:
        """An embedding model's `POST /`: `/embed`, or `/similarity` for its body."""
        if tei.is_similarity(self._json(body)):
            return await self.similarity(body)
        return await self.embed(body)

    async def embed(self, body: bytes) -> Answer:
        _, limits, pipeline, data = self.app.served_for(body, EMBED)
        job = tei.parse_embed(data, limits, pipeline.inputs)
        vectors, num_tokens = await pipeline.embed(job)
        self.app.metrics.count(num_tokens, len(vectors))
        return 200, JSON, dumps(vectors)

    async def embed_all(self, body: bytes) -> Answer:
        _, limits, pipeline, data = self.app.served_for(body, EMBED)
        job = tei.parse_embed_all(data, limits, pipeline.inputs)
        states, num_tokens = await pipeline.token_states(job, limits.max_multivector_values)
        self.app.metrics.count(num_tokens, len(states))
        return 200, JSON, dumps(tei.token_rows(states))

    async def embed_sparse(self, body: bytes) -> Answer:
        """TEI's sparse embeddings (SPLADE, bge-m3's lexical weights): `gateway.output_bodies`."""
        _, limits, pipeline, data = self.app.served_for(body, EMBED, lambda _: ("sparse",))
        job = output_bodies.parse_embed_sparse(data, limits, pipeline.inputs.head())
        encoded, num_tokens = await pipeline.outputs(job, limits)
        self.app.metrics.count(num_tokens, len(encoded))
        return 200, JSON, dumps(output_bodies.tei_sparse_body(encoded))

    async def similarity(self, body: bytes) -> Answer:
        _, limits, pipeline, data = self.app.served_for(body, EMBED)
        job = tei.parse_similarity(data, limits, pipeline.inputs)
        vectors, num_tokens = await pipeline.embed(job)
        self.app.metrics.count(num_tokens, len(vectors))
        return 200, JSON, dumps(tei.cosines(vectors))

    async def decode(self, body: bytes) -> Answer:
        _, _, pipeline, data = self.app.served_for(body, ANY)
        batch, skip = tei.parse_decode(data, pipeline.inputs.vocab_size)
        return 200, JSON, dumps(tei.decode(pipeline.inputs.spec.path, batch, skip))

    async def info(self, body: bytes) -> Answer:
        served = self.app.served
        model = served.pick(None, ANY)  # several models, no default: 400 naming them (no body)
        # ours beside TEI's keys: the routes this model answers when a request names none
        default_for = [t for t, m in served.defaults.items() if m is model] or (
            [] if served.several else [ANY, *(t for t in DEFAULT_TASKS if model.does(t))]
        )
        return 200, JSON, dumps({**self.info_of(model), "default_for": default_for})

    @staticmethod
    def info_of(model: ServedModel) -> dict[str, Any]:
        """TEI's `/info` of a served model (its gRPC `Info` too)."""
        pipeline = model.started()
        spec = pipeline.inputs.spec
        facts = tei.InfoFacts(
            pooling=str(spec.pooling),
            max_input_length=spec.max_seq_length,
            max_batch_tokens=pipeline.limits.part_tokens,
            tokenization_workers=pipeline.tokenize_threads,
            labels=tuple(spec.labels.labels) if spec.labels is not None else (),
        )
        return tei.info_body(model.name, model.limits, facts)

    async def cohere_embed(self, body: bytes) -> Answer:
        _, limits, pipeline, data = self.app.served_for(body, EMBED)
        job = cohere.parse_embed(data, limits, pipeline.inputs)
        rows, num_tokens = await pipeline.embed(job.job)
        self.app.metrics.count(num_tokens, len(rows))
        return 200, JSON, dumps(cohere.embed_body(rows, job, num_tokens))

    async def cohere_rerank(self, body: bytes) -> Answer:
        _, limits, pipeline, data = self.app.served_for(body, SCORE)
        job, top_n = cohere.parse_rerank(data, limits)
        scores, num_tokens = await pipeline.score(job)
        self.app.metrics.count(num_tokens, job.num_documents)
        return 200, JSON, dumps(cohere.rerank_body(scores, top_n))

    async def docs(self, body: bytes) -> Answer:
        return 200, HTML, docs_html()

    async def not_a_page(self, body: bytes) -> Answer:
        """`GET /`: the 404 it always was (not a 405: `POST /` is TEI's), pointing the way."""
        raise ApiError(
            404,
            "no route GET /: POST / is text-embeddings-inference's route for the model's task; "
            "every route is listed at /docs and in /openapi.json",
            code="not_found",
        )
