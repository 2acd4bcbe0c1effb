"""The hand-written OpenAPI 3 document served at `/openapi.json` (see docs/serving.md)."""

from __future__ import annotations

from typing import Any

from embedserve.core.head import OUTPUT_DTYPES
from embedserve.core.inputs import INPUT_TYPES
from embedserve.gateway.classify_schema import classify_paths, classify_schemas
from embedserve.gateway.requests import ENCODING_FORMATS, Limits

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


_INT = {"type": "integer"}
_NULLABLE_INT = {"type": "integer", "nullable": True}
# /v1/models (`gateway.models.ServedModel.describe`): OpenAI's fields, then what each model does
# here and its own limits (a model's `--model-limit` / models-file values, else the gateway's)
MODEL_LIST: dict[str, Any] = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "object", "task", "limits"],
                "properties": {
                    "id": {"type": "string"},
                    "object": {"type": "string", "enum": ["model"]},
                    "created": _INT,
                    "owned_by": {"type": "string"},
                    "task": {"type": "string"},
                    "scoring": {"type": "string", "nullable": True},
                    "aliases": {"type": "array", "items": {"type": "string"}},
                    "dimensions": _NULLABLE_INT,
                    "min_dimensions": _NULLABLE_INT,
                    "outputs": {"type": "array", "items": {"type": "string"}},
                    "limits": {
                        "type": "object",
                        "properties": {
                            "max_inputs": _INT,
                            "max_tokens_per_request": _NULLABLE_INT,
                            "max_chunks_per_document": _INT,
                        },
                    },
                },
            },
        },
    },
}


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
    embeddings_request = _embeddings_request(limits)
    embedding, embeddings_response = _embeddings_response()
    usage = embeddings_response["properties"]["usage"]
    schemas = {
        "embeddings": (embeddings_request, embeddings_response),
        "contextual": (
            _contextual_request(limits, embeddings_request),
            _contextual_response(embedding, usage),
        ),
        "tokenize": (_tokenize_request(limits, embeddings_request), None),
        **_scoring_schemas(limits, usage),
        **classify_schemas(limits, _score_response(usage)),
    }
    for request, _ in schemas.values():
        _optional_nullable(request)
    return {
        "openapi": "3.0.3",
        "info": {"title": "embedserve", "version": "0.1.0", "description": f"Serving {model}."},
        "paths": {**_work_paths(schemas), **_service_paths()},
        "components": {"schemas": {"Error": ERROR}},
    }


# bge-m3's score weights (`retrieval.scores.late_plan`)
M3_WEIGHTS = {
    "type": "array",
    "items": {"type": "number", "minimum": 0},
    "minItems": 3,
    "maxItems": 3,
    "description": "bge-m3 only: the (dense, sparse, colbert) weights of its score "
    "(FlagEmbedding's weights_for_different_modes; default 1, 1, 1). A ColBERT model scores by "
    "MaxSim, a SPLADE model by the sparse dot product",
}


def _texts() -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}


def _embeddings_request(limits: Limits) -> dict[str, Any]:
    ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["input"],
        "properties": {
            "input": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {**_texts(), "maxItems": limits.max_inputs},
                    ids,
                    {"type": "array", "items": ids, "minItems": 1, "maxItems": limits.max_inputs},
                ]
            },
            "model": {"type": "string", "enum": list(limits.model_names)},
            "encoding_format": {"type": "string", "enum": list(ENCODING_FORMATS)},
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
            "outputs": {
                "type": "array",
                "items": {"type": "string", "enum": list(limits.outputs)},
                "minItems": 1,
                "description": "embedserve's extension for sparse and multi-vector models "
                "(SPLADE, bge-m3, ColBERT; /v1/models lists each model's outputs; those of the "
                "models served are listed here): any of "
                "dense (`embedding`), sparse (`sparse`: {indices, values}) and multivector "
                "(`multivector`: one vector per token), from one forward; encoding_format and "
                "output_dtype apply to the vectors, dimensions to the dense one. ColBERT: "
                'input_type "query" encodes queries. Default: dense only',
            },
        },
    }


def _embeddings_response() -> tuple[dict[str, Any], dict[str, Any]]:
    """One embedding's schema, and the embeddings answer's (a list of them, with usage)."""
    embedding = {
        "type": "object",
        "properties": {
            "object": {"type": "string", "enum": ["embedding"]},
            "index": {"type": "integer"},
            "embedding": {
                "oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]
            },
            "sparse": {
                "type": "object",
                "description": "with outputs [sparse]: ascending token ids, their weights (> 0)",
                "required": ["indices", "values"],
                "properties": {
                    "indices": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    "values": {"type": "array", "items": {"type": "number"}},
                },
            },
            "multivector": {
                "type": "array",
                "description": "with outputs [multivector]: one unit vector per token",
                "items": {
                    "oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]
                },
            },
        },
    }
    response = {
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
    return embedding, response


def _contextual_request(limits: Limits, embeddings_request: dict[str, Any]) -> dict[str, Any]:
    # the output options are the embeddings endpoint's own (the very same schema objects)
    head = {
        key: embeddings_request["properties"][key]
        for key in ("model", "encoding_format", "dimensions", "user", "normalize", "output_dtype")
    }
    chunks = {
        "type": "array",
        "items": NOT_BLANK,
        "minItems": 1,
        "maxItems": limits.max_chunks,
        "description": "one document: its chunks in order (joined with `separator`)",
    }
    return {
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


def _contextual_response(embedding: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    return {
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
            "usage": usage,
        },
    }


def _tokenize_request(limits: Limits, embeddings_request: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["input"],
        "properties": {
            "input": {"oneOf": [{"type": "string", "minLength": 1}, _texts()]},
            "model": {"type": "string"},
            "truncate": {"enum": [False, "end", "start"]},
            **{
                key: embeddings_request["properties"][key]
                for key in ("input_type", "instruction", "prompt_name", "prompt")
            },
        },
    }


Schemas = tuple[dict[str, Any], dict[str, Any] | None]  # a route's request and answer


def _scoring_schemas(limits: Limits, usage: dict[str, Any]) -> dict[str, Schemas]:
    """The three scoring routes' requests and answers: rerank, TEI's rerank, score."""
    return {
        "rerank": (_rerank_request(limits), _rerank_response(usage)),
        "tei_rerank": (_tei_rerank_request(limits), _tei_rerank_response()),
        "score": (_score_request(limits), _score_response(usage)),
    }


def _documents(limits: Limits) -> dict[str, Any]:
    document = {"oneOf": [NOT_BLANK, {
        "type": "object", "additionalProperties": False, "required": ["text"],
        "properties": {"text": NOT_BLANK}}]}  # fmt: skip
    return {"type": "array", "items": document, "minItems": 1, "maxItems": limits.max_inputs}


def _model_name(limits: Limits) -> dict[str, Any]:
    return {"type": "string", "enum": list(limits.model_names)}


PAIR_TRUNCATE = {"enum": [False, "end", "start"]}


def _rerank_request(limits: Limits) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["query", "documents"],
        "properties": {
            "query": NOT_BLANK,
            "documents": _documents(limits),
            "top_n": {"type": "integer", "minimum": 1},
            "return_documents": {"type": "boolean", "default": False},
            "truncate": dict(PAIR_TRUNCATE),
            "instruction": {"type": "string", "minLength": 1},
            "model": _model_name(limits),
            "weights": dict(M3_WEIGHTS),
        },
    }


def _tei_rerank_request(limits: Limits) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["query", "texts"],
        "properties": {
            "query": NOT_BLANK,
            "texts": {**_documents(limits), "items": NOT_BLANK},
            "raw_scores": {"type": "boolean", "default": False},
            "return_text": {"type": "boolean", "default": False},
            "truncate": {"type": "boolean", "default": False},
            "truncation_direction": {"enum": ["Right", "Left"], "default": "Right"},
            "model": _model_name(limits),
        },
    }


def _score_request(limits: Limits) -> dict[str, Any]:
    one_or_many = {
        "oneOf": [
            {"type": "string", "minLength": 1},
            {**_texts(), "maxItems": limits.max_inputs},
        ]
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["text_1", "text_2"],
        "properties": {
            "text_1": one_or_many,
            "text_2": one_or_many,
            "truncate": dict(PAIR_TRUNCATE),
            "instruction": {"type": "string", "minLength": 1},
            "model": _model_name(limits),
            "user": {"type": "string"},
            "weights": dict(M3_WEIGHTS),
        },
    }


def _rerank_response(usage: dict[str, Any]) -> dict[str, Any]:
    return {
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


def _tei_rerank_response() -> dict[str, Any]:
    return {"type": "array", "items": {
        "type": "object", "required": ["index", "score"],
        "properties": {"index": {"type": "integer", "minimum": 0}, "score": {"type": "number"},
                       "text": {"type": "string"}}}}  # fmt: skip


def _score_response(usage: dict[str, Any]) -> dict[str, Any]:
    return {
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


def _work_paths(schemas: dict[str, Schemas]) -> dict[str, Any]:
    """The routes that embed, score or tokenize, in the document's order."""

    def post(summary: str, name: str, errors: dict[str, Any]) -> dict[str, Any]:
        request, answer = schemas[name]
        return {
            "post": {
                "summary": summary,
                "requestBody": _json_body(request),
                "responses": {**_ok(answer), **errors},
            }
        }

    # 415: a body sent without `Content-Type: application/json`
    work_errors = _errors(400, 404, 413, 415, 429, 500, 503)
    return {
        "/v1/embeddings": post(
            "Create embeddings (OpenAI-compatible, with extensions)", "embeddings", work_errors
        ),
        "/v1/contextualizedembeddings": post(
            "Contextualized (late-chunking) embeddings: each document is "
            "embedded once, whole; each chunk's vector pools its own tokens",
            "contextual",
            work_errors,
        ),
        "/v1/rerank": post(
            "Rerank documents for a query (Cohere / Jina shape), best first", "rerank", work_errors
        ),
        "/rerank": post(
            "Rerank texts for a query (text-embeddings-inference shape)", "tei_rerank", work_errors
        ),
        "/v1/score": post(
            "Scores of text_1 against text_2 pairs (vLLM shape), in order", "score", work_errors
        ),
        "/v1/models": {
            "get": {
                "summary": "The served models: each one's task, dimensions, outputs and limits",
                "responses": _ok(MODEL_LIST),
            }
        },
        "/tokenize": post(
            "Token ids of texts, as the embeddings endpoint would send them",
            "tokenize",
            _errors(400, 404, 413, 415),
        ),
        **classify_paths(post, schemas, work_errors),
    }


def _service_paths() -> dict[str, Any]:
    """Liveness, readiness and metrics: no body, no model."""
    return {
        "/health": {"get": {"summary": "The gateway process is alive", "responses": _ok()}},
        "/ready": {
            "get": {
                "summary": "At least one server replica is healthy (any Host, no key; the "
                "replicas' details for a request that passes the Host and key checks)",
                "responses": {**_ok(), **_errors(503)},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (text format)",
                "responses": {"200": {"description": "OK", "content": {"text/plain": {}}}},
            }
        },
    }
