"""The drop-in routes' part of `/openapi.json`: text-embeddings-inference's routes, Cohere's v2,
the API page. `api_document` is the whole document the app serves: `openapi_document`'s
routes and these.
"""

from __future__ import annotations

import copy
from typing import Any

from embedserve.gateway import cohere
from embedserve.gateway.openapi import (
    NOT_BLANK,
    _documents,
    _errors,
    _json_body,
    _model_name,
    _ok,
    _optional_nullable,
    openapi_document,
)
from embedserve.gateway.requests import Limits

TEI_ERROR = {
    "type": "object",
    "required": ["error", "error_type"],
    "properties": {"error": {"type": "string"}, "error_type": {"type": "string"}},
}
NUMBERS = {"type": "array", "items": {"type": "number"}}
SPARSE_VALUE = {
    "type": "object",
    "required": ["index", "value"],
    "properties": {"index": {"type": "integer", "minimum": 0}, "value": {"type": "number"}},
}
TEI_TRUNCATION = {
    "truncate": {"type": "boolean", "default": False},
    "truncation_direction": {"enum": ["Right", "Left", "right", "left"], "default": "Right"},
    "prompt_name": {"type": "string", "description": "one of the model's prompts"},
}


def api_document(model: str, limits: Limits) -> dict[str, Any]:
    doc = openapi_document(model, limits)
    embeddings = doc["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]
    own = copy.deepcopy(embeddings["application/json"]["schema"]["properties"])
    doc["paths"].update({**_tei_paths(limits, own, doc["paths"]), **_cohere_paths(limits, own)})
    doc["paths"].update(_page_paths())
    doc["components"]["schemas"]["TeiError"] = TEI_ERROR
    return doc


def _tei_errors(*statuses: int) -> dict[str, Any]:
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/TeiError"}}}
    return {str(s): {"description": "error (TEI's shape)", "content": ref} for s in statuses}


def _post(summary: str, request: dict[str, Any], answer: Any, errors: Any) -> dict[str, Any]:
    _optional_nullable(request)
    return {
        "post": {
            "summary": summary,
            "requestBody": _json_body(request),
            "responses": {**_ok(answer), **errors},
        }
    }


def _request(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": required,
        "properties": properties,
    }


def _tei_paths(limits: Limits, own: dict[str, Any], paths: dict[str, Any]) -> dict[str, Any]:
    errors = _tei_errors(400, 413, 415, 429, 500, 503)
    inputs = own["input"]

    def embed() -> dict[str, Any]:
        return _request(["inputs"], {
            "inputs": copy.deepcopy(inputs), "normalize": {"type": "boolean", "default": True},
            **copy.deepcopy(TEI_TRUNCATION), "dimensions": copy.deepcopy(own["dimensions"])})  # fmt: skip

    sentences = {"type": "array", "items": {"type": "string", "minLength": 1},
                 "minItems": 1, "maxItems": limits.max_inputs - 1}  # fmt: skip
    similarity = _request(["inputs"], {
        "inputs": _request(["source_sentence", "sentences"], {
            "source_sentence": {"type": "string", "minLength": 1}, "sentences": sentences}),
        "parameters": _request([], copy.deepcopy(TEI_TRUNCATION)),
        **copy.deepcopy(TEI_TRUNCATION), "dimensions": copy.deepcopy(own["dimensions"])})  # fmt: skip
    ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    decode = _request(["ids"], {
        "ids": {"oneOf": [ids, {"type": "array", "items": ids, "minItems": 1,
                                "maxItems": limits.max_inputs}]},
        "skip_special_tokens": {"type": "boolean", "default": True}})  # fmt: skip
    vectors = {"type": "array", "items": NUMBERS}
    if limits.task == "embed":
        root = _post("TEI's route for this embedding model: /embed (also takes /similarity's "
                     "body)", embed(), vectors, errors)  # fmt: skip
    else:
        rerank = copy.deepcopy(paths["/rerank"]["post"])
        rerank["summary"] = "TEI's route for this reranker: /rerank's body and answer"
        rerank["responses"] = {"200": rerank["responses"]["200"],
                               **_tei_errors(400, 404, 413, 415, 429, 500, 503)}  # fmt: skip
        root = {"post": rerank}
    return {
        "/": root,
        "/embed": _post("Embeddings (text-embeddings-inference shape)", embed(), vectors, errors),
        "/embed_all": _post(
            "Every token's final hidden state per input (TEI shape)",
            _request(
                ["inputs"],
                {
                    "inputs": copy.deepcopy(inputs),
                    **copy.deepcopy(TEI_TRUNCATION),
                    "normalize": {"type": "boolean", "description": "accepted, ignored (as TEI)"},
                },
            ),
            {"type": "array", "items": vectors},
            errors,
        ),
        **_sparse_path(limits, inputs, errors),
        "/similarity": _post(
            "Cosine of the source sentence with each sentence (TEI shape)",
            similarity,
            NUMBERS,
            errors,
        ),
        "/decode": _post(
            "Texts of token ids, with the model's tokenizer (TEI shape)",
            decode,
            {"type": "array", "items": {"type": "string"}},
            _tei_errors(400, 413, 415),
        ),
        "/info": {
            "get": {
                "summary": "The model and the limits (TEI shape)",
                "responses": {**_ok(_info()), **_tei_errors(503)},
            }
        },
    }


def _sparse_path(limits: Limits, inputs: Any, errors: Any) -> dict[str, Any]:
    """`/embed_sparse`, listed when a model served has a sparse output (else it answers 400)."""
    if "sparse" not in limits.outputs:
        return {}
    request = _request(["inputs"], {"inputs": copy.deepcopy(inputs),
                                    **copy.deepcopy(TEI_TRUNCATION), "model": _model_name(limits)})  # fmt: skip
    answer = {"type": "array", "items": {"type": "array", "items": SPARSE_VALUE}}
    summary = ("Sparse (lexical) vectors per input, pooled and thresholded (TEI shape): SPLADE, "
               "bge-m3's lexical weights")  # fmt: skip
    return {"/embed_sparse": _post(summary, request, answer, errors)}


def _info() -> dict[str, Any]:
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


def _cohere_paths(limits: Limits, own: dict[str, Any]) -> dict[str, Any]:
    errors = _errors(400, 404, 413, 415, 429, 500, 503)
    texts = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
             "maxItems": limits.max_inputs}  # fmt: skip
    embed = _request(["texts"], {
        "texts": texts, "model": _model_name(limits),
        "input_type": {"type": "string", "enum": list(cohere.INPUT_TYPES)},
        "embedding_types": {"type": "array", "minItems": 1, "default": ["float"], "items": {
            "type": "string", "enum": list(cohere.EMBEDDING_TYPES)}},
        "truncate": {"type": "string", "enum": list(cohere.TRUNCATE), "default": "END"},
        "output_dimension": copy.deepcopy(own["dimensions"]),
        "priority": {"type": "integer", "description": "accepted, ignored"}})  # fmt: skip
    ints = {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}
    by_type = {kind: ints for kind in cohere.EMBEDDING_TYPES}
    by_type["float"] = {"type": "array", "items": NUMBERS}
    by_type["base64"] = {"type": "array", "items": {"type": "string"}}
    embedded = {"type": "object", "required": ["id", "embeddings"], "properties": {
        "id": {"type": "string"}, "embeddings": {"type": "object", "properties": by_type},
        "texts": {"type": "array", "items": {"type": "string"}}, "meta": {"type": "object"},
        "response_type": {"type": "string"}}}  # fmt: skip
    rerank = _request(["query", "documents"], {
        "query": NOT_BLANK, "documents": _documents(limits),
        "top_n": {"type": "integer", "minimum": 1}, "model": _model_name(limits),
        "priority": {"type": "integer", "description": "accepted, ignored"}})  # fmt: skip
    result = {
        "type": "object",
        "required": ["index", "relevance_score"],
        "properties": {
            "index": {"type": "integer", "minimum": 0},
            "relevance_score": {"type": "number"},
        },
    }
    ranked = {"type": "object", "required": ["results"], "properties": {
        "id": {"type": "string"}, "results": {"type": "array", "items": result},
        "meta": {"type": "object"}}}  # fmt: skip
    return {
        "/v2/embed": _post("Embeddings by type (Cohere v2 shape)", embed, embedded, errors),
        "/v2/rerank": _post(
            "Rerank documents for a query (Cohere v2 shape), best first", rerank, ranked, errors
        ),
    }


def _page_paths() -> dict[str, Any]:
    page = {"200": {"description": "the API page", "content": {"text/html": {}}}}
    return {
        "/docs": {"get": {"summary": "This API, interactive (no CDN)", "responses": page}},
        "/redoc": {"get": {"summary": "The same page as /docs", "responses": page}},
    }
