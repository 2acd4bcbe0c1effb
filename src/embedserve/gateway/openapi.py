"""The hand-written OpenAPI 3 document served at `/openapi.json` (see docs/serving.md)."""

from __future__ import annotations

from typing import Any

from embedserve.core.inputs import INPUT_TYPES
from embedserve.core.outputs import OUTPUT_DTYPES
from embedserve.gateway.requests import Limits

ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
}


def _errors(*statuses: int) -> dict[str, Any]:
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    return {str(s): {"description": "error", "content": ref} for s in statuses}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _ok(schema: dict[str, Any] | None = None) -> dict[str, Any]:
    content = {"application/json": {"schema": schema or {"type": "object"}}}
    return {"200": {"description": "OK", "content": content}}


def _optional_nullable(request: dict[str, Any]) -> dict[str, Any]:
    """Every optional property of a request object may be null: the server reads null as
    absent (tests/gateway/test_openapi_exact.py checks both against the running app)."""
    required = set(request.get("required", ()))
    for name, prop in request["properties"].items():
        if name not in required:
            prop["nullable"] = True
    return request


# a string with something in it: blank queries, documents and chunks are refused
NOT_BLANK = {"type": "string", "minLength": 1, "pattern": r"\S"}


def openapi_document(model: str, limits: Limits) -> dict[str, Any]:
    ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    texts = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
    embeddings_request = {
        "type": "object",
        "additionalProperties": False,
        "required": ["input"],
        "properties": {
            "input": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {**texts, "maxItems": limits.max_inputs},
                    ids,
                    {"type": "array", "items": ids, "minItems": 1, "maxItems": limits.max_inputs},
                ]
            },
            "model": {"type": "string", "enum": list(limits.model_names)},
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "dimensions": {
                "type": "integer",
                "minimum": limits.min_dimensions,
                "maximum": limits.hidden_size,
            },
            "user": {"type": "string"},
            "normalize": {"type": "boolean", "default": True},
            "truncate": {"enum": [False, "end", "start", "chunk"], "default": False},
            "input_type": {"type": "string", "enum": list(INPUT_TYPES)},
            "instruction": {
                "type": "string",
                "minLength": 1,
                "description": "a query instruction (Qwen3-Embedding's format)",
            },
            "prompt_name": {"type": "string", "description": "one of the model's prompts"},
            "prompt": {"type": "string", "description": "a literal text put before each input"},
            "output_dtype": {
                "type": "string",
                "enum": list(OUTPUT_DTYPES),
                "default": limits.default_output_dtype,
            },
        },
    }
    embedding = {
        "type": "object",
        "properties": {
            "object": {"type": "string", "enum": ["embedding"]},
            "index": {"type": "integer"},
            "embedding": {
                "oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]
            },
        },
    }
    embeddings_response = {
        "type": "object",
        "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": embedding},
            "model": {"type": "string"},
            "usage": {
                "type": "object",
                "properties": {
                    "prompt_tokens": {"type": "integer"},
                    "total_tokens": {"type": "integer"},
                },
            },
        },
    }
    head = {
        key: embeddings_request["properties"][key]  # type: ignore[index]
        for key in ("model", "encoding_format", "dimensions", "user", "normalize", "output_dtype")
    }
    chunks = {
        "type": "array",
        "items": NOT_BLANK,
        "minItems": 1,
        "maxItems": limits.max_chunks,
        "description": "one document: its chunks in order (joined with `separator`)",
    }
    contextual_request = {
        "type": "object",
        "additionalProperties": False,
        "required": ["input"],
        "properties": {
            "input": {
                "type": "array",
                "items": chunks,
                "minItems": 1,
                "maxItems": limits.max_inputs,
            },
            "separator": {"type": "string", "default": " "},
            **head,
        },
    }
    contextual_response = {
        "type": "object",
        "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "object": {"type": "string", "enum": ["list"]},
                        "index": {"type": "integer"},
                        "data": {"type": "array", "items": embedding},
                    },
                },
            },
            "model": {"type": "string"},
            "usage": embeddings_response["properties"]["usage"],  # type: ignore[index]
        },
    }
    tokenize_request = {
        "type": "object",
        "additionalProperties": False,
        "required": ["input"],
        "properties": {
            "input": {"oneOf": [{"type": "string", "minLength": 1}, texts]},
            "model": {"type": "string"},
            "truncate": {"enum": [False, "end", "start"]},
            **{
                key: embeddings_request["properties"][key]  # type: ignore[index]
                for key in ("input_type", "instruction", "prompt_name", "prompt")
            },
        },
    }
    document = {"oneOf": [NOT_BLANK, {
        "type": "object", "additionalProperties": False, "required": ["text"],
        "properties": {"text": NOT_BLANK}}]}  # fmt: skip
    documents = {"type": "array", "items": document, "minItems": 1, "maxItems": limits.max_inputs}
    model_name = {"type": "string", "enum": list(limits.model_names)}
    pair_truncate = {"enum": [False, "end", "start"]}
    rerank_request = {
        "type": "object",
        "additionalProperties": False,
        "required": ["query", "documents"],
        "properties": {
            "query": NOT_BLANK,
            "documents": documents,
            "top_n": {"type": "integer", "minimum": 1},
            "return_documents": {"type": "boolean", "default": False},
            "truncate": pair_truncate,
            "instruction": {"type": "string", "minLength": 1},
            "model": model_name,
        },
    }
    tei_rerank_request = {
        "type": "object",
        "additionalProperties": False,
        "required": ["query", "texts"],
        "properties": {
            "query": NOT_BLANK,
            "texts": {**documents, "items": NOT_BLANK},
            "raw_scores": {"type": "boolean", "default": False},
            "return_text": {"type": "boolean", "default": False},
            "truncate": {"type": "boolean", "default": False},
            "truncation_direction": {"enum": ["Right", "Left"], "default": "Right"},
            "model": model_name,
        },
    }
    one_or_many = {
        "oneOf": [{"type": "string", "minLength": 1}, {**texts, "maxItems": limits.max_inputs}]
    }
    score_request = {
        "type": "object",
        "additionalProperties": False,
        "required": ["text_1", "text_2"],
        "properties": {
            "text_1": one_or_many,
            "text_2": one_or_many,
            "truncate": pair_truncate,
            "instruction": {"type": "string", "minLength": 1},
            "model": model_name,
            "user": {"type": "string"},
        },
    }
    usage = embeddings_response["properties"]["usage"]  # type: ignore[index]
    rerank_response = {
        "type": "object",
        "required": ["id", "model", "results", "usage"],
        "properties": {
            "id": {"type": "string"},
            "model": {"type": "string"},
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "relevance_score"],
                    "properties": {
                        "index": {"type": "integer", "minimum": 0},
                        "relevance_score": {"type": "number"},
                        "document": {"type": "object", "properties": {"text": {"type": "string"}}},
                    },
                },
            },
            "usage": usage,
        },
    }
    tei_rerank_response = {"type": "array", "items": {
        "type": "object", "required": ["index", "score"],
        "properties": {"index": {"type": "integer", "minimum": 0}, "score": {"type": "number"},
                       "text": {"type": "string"}}}}  # fmt: skip
    score_response = {
        "type": "object",
        "required": ["id", "object", "created", "model", "data", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "enum": ["list"]},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "object", "score"],
                    "properties": {
                        "index": {"type": "integer", "minimum": 0},
                        "object": {"type": "string", "enum": ["score"]},
                        "score": {"type": "number"},
                    },
                },
            },
            "usage": usage,
        },
    }
    scoring_errors = _errors(400, 404, 413, 429, 500, 503)
    for request in (embeddings_request, contextual_request, tokenize_request, rerank_request,
                    tei_rerank_request, score_request):  # fmt: skip
        _optional_nullable(request)
    return {
        "openapi": "3.0.3",
        "info": {"title": "embedserve", "version": "0.1.0", "description": f"Serving {model}."},
        "paths": {
            "/v1/embeddings": {
                "post": {
                    "summary": "Create embeddings (OpenAI-compatible, with extensions)",
                    "requestBody": _json_body(embeddings_request),
                    "responses": {
                        **_ok(embeddings_response),
                        **_errors(400, 404, 413, 429, 500, 503),
                    },
                }
            },
            "/v1/contextualizedembeddings": {
                "post": {
                    "summary": "Contextualized (late-chunking) embeddings: each document is "
                    "embedded once, whole; each chunk's vector pools its own tokens",
                    "requestBody": _json_body(contextual_request),
                    "responses": {
                        **_ok(contextual_response),
                        **_errors(400, 404, 413, 429, 500, 503),
                    },
                }
            },
            "/v1/rerank": {
                "post": {
                    "summary": "Rerank documents for a query (Cohere / Jina shape), best first",
                    "requestBody": _json_body(rerank_request),
                    "responses": {**_ok(rerank_response), **scoring_errors},
                }
            },
            "/rerank": {
                "post": {
                    "summary": "Rerank texts for a query (text-embeddings-inference shape)",
                    "requestBody": _json_body(tei_rerank_request),
                    "responses": {**_ok(tei_rerank_response), **scoring_errors},
                }
            },
            "/v1/score": {
                "post": {
                    "summary": "Scores of text_1 against text_2 pairs (vLLM shape), in order",
                    "requestBody": _json_body(score_request),
                    "responses": {**_ok(score_response), **scoring_errors},
                }
            },
            "/v1/models": {"get": {"summary": "The served model", "responses": _ok()}},
            "/tokenize": {
                "post": {
                    "summary": "Token ids of texts, as the embeddings endpoint would send them",
                    "requestBody": _json_body(tokenize_request),
                    "responses": {**_ok(), **_errors(400, 404, 413)},
                }
            },
            "/health": {"get": {"summary": "The gateway process is alive", "responses": _ok()}},
            "/ready": {
                "get": {
                    "summary": "At least one server replica is healthy",
                    "responses": {**_ok(), **_errors(503)},
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (text format)",
                    "responses": {"200": {"description": "OK", "content": {"text/plain": {}}}},
                }
            },
        },
        "components": {"schemas": {"Error": ERROR}},
    }
