"""The drop-in routes' part of `/openapi.json`: text-embeddings-inference's routes, Cohere's v2,
the API page. `api_document` is the whole document the app serves: `openapi.operations`' routes
and these, in the app's route table order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from embedserve.gateway import cohere
from embedserve.gateway.openapi import Operation, Route, document, errors, ok, operations, post
from embedserve.gateway.openapi_bodies import (
    NOT_BLANK,
    TEXT,
    documents,
    embeddings_request,
    model_name,
    token_ids,
)
from embedserve.gateway.openapi_types import (
    Field,
    Schema,
    array,
    body,
    boolean,
    choice,
    integer,
    number,
    obj,
    string,
)
from embedserve.gateway.requests import Limits

TEI_ERROR = {
    "type": "object",
    "required": ["error", "error_type"],
    "properties": {"error": {"type": "string"}, "error_type": {"type": "string"}},
}
NUMBERS = array(number())
SPARSE_VALUE = {
    "type": "object",
    "required": ["index", "value"],
    "properties": {"index": integer(minimum=0), "value": number()},
}
PRIORITY = Field(
    "priority",
    integer(minimum=0, description="0 (default): the lane by route and size; 1 or more: bulk"),
)


def api_document(model: str, limits: Limits, routes: Iterable[Route]) -> dict[str, Any]:
    own = operations(limits)
    dropin = {**_tei_operations(limits, own), **_cohere_operations(limits), **_page_operations()}
    return document(model, {**own, **dropin}, routes, {"TeiError": TEI_ERROR})


def _tei_errors(*statuses: int) -> dict[str, Any]:
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/TeiError"}}}
    return {str(s): {"description": "error (TEI's shape)", "content": ref} for s in statuses}


def _truncation() -> list[Field]:
    """TEI's truncation fields (and its prompt name), in every TEI request."""
    return [
        Field("truncate", boolean(default=False)),
        Field("truncation_direction",
              choice("Right", "Left", "right", "left", default="Right")),
        Field("prompt_name", string(description="one of the model's prompts")),
    ]  # fmt: skip


def _embed_fields(limits: Limits) -> tuple[Field, Field]:
    """`inputs` and `dimensions` as the embeddings endpoint has them."""
    own = embeddings_request(limits)["properties"]
    return Field("inputs", own["input"], required=True), Field("dimensions", own["dimensions"])


def _tei_operations(limits: Limits, own: dict[Route, Operation]) -> dict[Route, Operation]:
    errors = _tei_errors(400, 413, 415, 429, 500, 503)
    inputs, dimensions = _embed_fields(limits)
    embed = body(inputs, Field("normalize", boolean(default=True)), *_truncation(), dimensions)
    vectors = array(NUMBERS)
    embed_all = body(inputs, *_truncation(), Field("normalize", boolean(
        description="accepted, ignored (as TEI)")))  # fmt: skip
    return {
        ("POST", "/"): _root(
            limits,
            own,
            post(
                "TEI's route for this embedding model: /embed (also takes /similarity's body)",
                embed,
                vectors,
                errors,
            ),
        ),
        ("POST", "/embed"): post(
            "Embeddings (text-embeddings-inference shape)", embed, vectors, errors
        ),
        ("POST", "/embed_all"): post(
            "Every token's final hidden state per input (TEI shape)",
            embed_all,
            array(vectors),
            errors,
        ),
        **_sparse_operation(limits, inputs, errors),
        ("POST", "/similarity"): post(
            "Cosine of the source sentence with each sentence (TEI shape)",
            _similarity_request(limits, dimensions),
            NUMBERS,
            errors,
        ),
        ("POST", "/decode"): post(
            "Texts of token ids, with the model's tokenizer (TEI shape)",
            _decode_request(limits),
            array(string()),
            _tei_errors(400, 413, 415),
        ),
        ("GET", "/info"): Operation(
            "The model and the limits (TEI shape)", {**ok(_info()), **_tei_errors(503)}
        ),
    }


def _root(limits: Limits, own: dict[Route, Operation], embed: Operation) -> Operation:
    """`POST /`: /embed's operation for an embedding model, else /rerank's with TEI's errors."""
    if limits.task == "embed":
        return embed
    rerank = own["POST", "/rerank"]
    responses = {"200": rerank.responses["200"], **_tei_errors(400, 404, 413, 415, 429, 500, 503)}
    summary = "TEI's route for this reranker: /rerank's body and answer"
    return Operation(summary, responses, rerank.request)


def _similarity_request(limits: Limits, dimensions: Field) -> Schema:
    sentences = array(TEXT, min_items=1, max_items=limits.max_inputs - 1)
    pair = obj(Field("source_sentence", TEXT, required=True),
               Field("sentences", sentences, required=True))  # fmt: skip
    return body(Field("inputs", pair, required=True), Field("parameters", obj(*_truncation())),
                *_truncation(), dimensions)  # fmt: skip


def _decode_request(limits: Limits) -> Schema:
    ids, batch = token_ids(limits)
    return body(Field("ids", {"oneOf": [ids, batch]}, required=True),
                Field("skip_special_tokens", boolean(default=True)))  # fmt: skip


def _sparse_operation(limits: Limits, inputs: Field, errors: Any) -> dict[Route, Operation]:
    """`/embed_sparse`, listed when a model served has a sparse output (else it answers 400)."""
    if "sparse" not in limits.outputs:
        return {}
    request = body(inputs, *_truncation(), Field("model", model_name(limits)))
    answer = array(array(SPARSE_VALUE))
    summary = ("Sparse (lexical) vectors per input, pooled and thresholded (TEI shape): SPLADE, "
               "bge-m3's lexical weights")  # fmt: skip
    return {("POST", "/embed_sparse"): post(summary, request, answer, errors)}


def _info() -> Schema:
    optional_int = {"type": "integer", "nullable": True}
    text, optional_text = {"type": "string"}, {"type": "string", "nullable": True}
    return {
        "type": "object",
        "required": ["model_id", "model_dtype", "model_type", "version"],
        "properties": {
            "model_id": text, "model_sha": optional_text, "model_dtype": text,
            "model_type": {"type": "object"}, "max_concurrent_requests": optional_int,
            "max_input_length": optional_int, "max_batch_tokens": optional_int,
            "max_batch_requests": optional_int, "max_client_batch_size": optional_int,
            "auto_truncate": {"type": "boolean"}, "tokenization_workers": optional_int,
            "version": text, "sha": optional_text, "docker_label": optional_text,
            # ours: the routes this model answers when a request names no model
            "default_for": {"type": "array", "items": {"type": "string"}},
        },
    }  # fmt: skip


def _cohere_operations(limits: Limits) -> dict[Route, Operation]:
    work_errors = errors(400, 404, 413, 415, 429, 500, 503)
    embedding_types = {"type": "array", "minItems": 1, "default": ["float"],
                       "items": string(enum=cohere.EMBEDDING_TYPES)}  # fmt: skip
    embed = body(
        Field("texts", array(TEXT, min_items=1, max_items=limits.max_inputs), required=True),
        Field("model", model_name(limits)),
        Field("input_type", string(enum=cohere.INPUT_TYPES)),
        Field("embedding_types", embedding_types),
        Field("truncate", string(enum=cohere.TRUNCATE, default="END")),
        Field("output_dimension", _embed_fields(limits)[1].schema),
        PRIORITY,
    )
    rerank = body(Field("query", NOT_BLANK, required=True),
                  Field("documents", documents(limits), required=True),
                  Field("top_n", integer(minimum=1)), Field("model", model_name(limits)),
                  PRIORITY)  # fmt: skip
    return {
        ("POST", "/v2/embed"): post(
            "Embeddings by type (Cohere v2 shape)", embed, _cohere_embedded(), work_errors
        ),
        ("POST", "/v2/rerank"): post(
            "Rerank documents for a query (Cohere v2 shape), best first",
            rerank,
            _cohere_ranked(),
            work_errors,
        ),
    }


def _cohere_embedded() -> Schema:
    ints = array(array(integer()))
    by_type = {kind: ints for kind in cohere.EMBEDDING_TYPES}
    by_type["float"] = array(NUMBERS)
    by_type["base64"] = array(string())
    return {"type": "object", "required": ["id", "embeddings"], "properties": {
        "id": string(), "embeddings": {"type": "object", "properties": by_type},
        "texts": array(string()), "meta": {"type": "object"}, "response_type": string()}}  # fmt: skip


def _cohere_ranked() -> Schema:
    result = {"type": "object", "required": ["index", "relevance_score"],
              "properties": {"index": integer(minimum=0), "relevance_score": number()}}  # fmt: skip
    return {"type": "object", "required": ["results"], "properties": {
        "id": string(), "results": array(result), "meta": {"type": "object"}}}  # fmt: skip


def _page_operations() -> dict[Route, Operation]:
    page = {"200": {"description": "the API page", "content": {"text/html": {}}}}
    return {
        ("GET", "/docs"): Operation("This API, interactive (no CDN)", page),
        ("GET", "/redoc"): Operation("The same page as /docs", page),
    }
