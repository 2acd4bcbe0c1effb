"""The OpenAPI 3 document served at `/openapi.json` (see docs/serving.md), built from the app's
route table: each route the document lists has an `Operation` (its summary, request body and
answers), keyed by the table's (method, path); the paths come in the table's order. A route with
none (an old alias, the document itself) is not listed. The request bodies are `Field` lists
(`gateway.openapi_bodies`), the answers `gateway.openapi_answers`; `gateway.openapi_dropin`
adds the drop-in APIs' operations."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from embedserve.gateway import openapi_bodies as bodies
from embedserve.gateway.classify_schema import classify_operations
from embedserve.gateway.openapi_answers import (
    ERROR,
    MODEL_LIST,
    contextual_answer,
    embeddings_answer,
    rerank_answer,
    score_answer,
    tei_rerank_answer,
)
from embedserve.gateway.openapi_types import Schema
from embedserve.gateway.requests import Limits

Route = tuple[str, str]  # (method, path), as the app's route table keys them


@dataclass(frozen=True)
class Operation:
    """One route's entry: its summary, answers (by status) and request body (None: none)."""

    summary: str
    responses: dict[str, Any]
    request: Schema | None = None

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"summary": self.summary}
        if self.request is not None:
            out["requestBody"] = {"required": True,
                                  "content": {"application/json": {"schema": self.request}}}  # fmt: skip
        out["responses"] = self.responses
        return out


def errors(*statuses: int) -> dict[str, Any]:
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    return {str(s): {"description": "error", "content": ref} for s in statuses}


def ok(schema: Schema | None = None) -> dict[str, Any]:
    content = {"application/json": {"schema": schema or {"type": "object"}}}
    return {"200": {"description": "OK", "content": content}}


def post(summary: str, request: Schema, answer: Schema | None, errors: dict[str, Any]) -> Operation:
    return Operation(summary, {**ok(answer), **errors}, request)


# 415: a body sent without `Content-Type: application/json`
WORK_ERRORS = (400, 404, 413, 415, 429, 500, 503)


def document(
    model: str, operations: dict[Route, Operation], routes: Iterable[Route], schemas: Schema
) -> dict[str, Any]:
    """The document: `operations` of the `routes` that have one, in the routes' order."""
    paths: dict[str, Any] = {}
    for method, path in routes:
        if (method, path) in operations:
            paths.setdefault(path, {})[method.lower()] = operations[method, path].entry()
    return {
        "openapi": "3.0.3",
        "info": {"title": "embedserve", "version": "0.1.0", "description": f"Serving {model}."},
        "paths": paths,
        "components": {"schemas": {"Error": ERROR, **schemas}},
    }


def operations(limits: Limits) -> dict[Route, Operation]:
    """Our own routes' operations (the drop-in APIs' are `gateway.openapi_dropin`'s)."""
    return {**_embedding_operations(limits), **_scoring_operations(limits),
            **_service_operations()}  # fmt: skip


def _embedding_operations(limits: Limits) -> dict[Route, Operation]:
    embeddings = bodies.embeddings_request(limits)
    embedding, answer = embeddings_answer()
    usage = answer["properties"]["usage"]
    return {
        ("POST", "/v1/embeddings"): post(
            "Create embeddings (OpenAI-compatible, with extensions)",
            embeddings,
            answer,
            errors(*WORK_ERRORS),
        ),
        ("POST", "/v1/contextualizedembeddings"): post(
            "Contextualized (late-chunking) embeddings: each document is "
            "embedded once, whole; each chunk's vector pools its own tokens",
            bodies.contextual_request(limits, embeddings),
            contextual_answer(embedding, usage),
            errors(*WORK_ERRORS),
        ),
        ("POST", "/tokenize"): post(
            "Token ids of texts, as the embeddings endpoint would send them",
            bodies.tokenize_request(embeddings),
            None,
            errors(400, 404, 413, 415),
        ),
    }


def _scoring_operations(limits: Limits) -> dict[Route, Operation]:
    usage = embeddings_answer()[1]["properties"]["usage"]
    return {
        ("POST", "/v1/rerank"): post(
            "Rerank documents for a query (Cohere / Jina shape), best first",
            bodies.rerank_request(limits),
            rerank_answer(usage),
            errors(*WORK_ERRORS),
        ),
        ("POST", "/rerank"): post(
            "Rerank texts for a query (text-embeddings-inference shape)",
            bodies.tei_rerank_request(limits),
            tei_rerank_answer(),
            errors(*WORK_ERRORS),
        ),
        ("POST", "/v1/score"): post(
            "Scores of text_1 against text_2 pairs (vLLM shape), in order",
            bodies.score_request(limits),
            score_answer(usage),
            errors(*WORK_ERRORS),
        ),
        **classify_operations(limits, score_answer(usage), post, errors(*WORK_ERRORS)),
    }


def _service_operations() -> dict[Route, Operation]:
    """The models list, liveness, readiness and metrics: no body, no model."""
    text = {"200": {"description": "OK", "content": {"text/plain": {}}}}
    return {
        ("GET", "/v1/models"): Operation(
            "The served models: each one's task, dimensions, outputs and limits", ok(MODEL_LIST)
        ),
        ("GET", "/health"): Operation("The gateway process is alive", ok()),
        ("GET", "/ready"): Operation(
            "At least one server replica is healthy (any Host, no key; the replicas' details "
            "for a request that passes the Host and key checks)",
            {**ok(), **errors(503)},
        ),
        ("GET", "/metrics"): Operation("Prometheus metrics (text format)", text),
    }
