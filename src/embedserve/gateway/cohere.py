"""Cohere's v2 API: `POST /v2/embed` and `POST /v2/rerank` bodies read into our jobs, and their
answers, in the shapes the `cohere` client (`cohere.ClientV2`) sends and parses.

- `/v2/embed`: `texts` (or `inputs`: content lists of text parts), `input_type`
  (`search_query` / `search_document` pick the model's query / document prompt;
  `classification` / `clustering` its prompt of that name when it has one), `embedding_types`
  (float, int8, uint8, binary, ubinary, base64: our output dtypes), `truncate` (NONE, START,
  END: Cohere's default END), `output_dimension`. The model runs once; every requested type is
  encoded from the same rows by the output rules `/v1/embeddings` uses.
- `/v2/rerank`: `query`, `documents`, `top_n`; documents over the model's limit are cut at their
  end, as Cohere cuts them.
- both: `priority`, Cohere's (lower is handled earlier): 1 or more puts the request in the bulk
  lane (`core.lanes`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.core import lanes
from embedserve.core.head import Head, to_base64
from embedserve.core.inputs import InputPreparer
from embedserve.core.pairs import check_top_n, ranked
from embedserve.gateway.errors import bad_request
from embedserve.gateway.requests import EmbedJob, Limits, check_model, check_object
from embedserve.gateway.scoring import RERANK_TRUNCATE, ScoreJob, documents_of

EMBED_FIELDS = frozenset(
    {"model", "texts", "inputs", "input_type", "embedding_types", "truncate",
     "output_dimension", "priority"}
)  # fmt: skip
RERANK_FIELDS = frozenset({"model", "query", "documents", "top_n", "priority"})
# Cohere's fields that change the answer and that we do not do: a clear 400, not a silent no-op
UNSUPPORTED = {
    "images": "image inputs are not supported: this server embeds text",
    "max_tokens": "max_tokens is not supported: an input is cut to the model's own limit "
    "(by truncate) or refused",
    "max_tokens_per_doc": "max_tokens_per_doc is not supported: a document is cut to the "
    "model's own limit for its pair",
    "relevant_spans": "relevant_spans is not supported",
}
EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")
OUTPUT_DTYPE = {"float": "float32", "base64": "float32"}  # the others are our dtypes' names
INPUT_TYPES = ("search_query", "search_document", "classification", "clustering")
TRUNCATE = {"NONE": False, "START": "start", "END": "end"}


@dataclass(frozen=True)
class CohereEmbedJob:
    job: EmbedJob  # un-normalized float32 rows of `dimensions`, encoded per type afterwards
    heads: dict[str, Head]  # per embedding type
    texts: list[str]


def _check_supported(body: Any) -> None:
    if isinstance(body, dict):
        for key, why in UNSUPPORTED.items():
            if body.get(key) is not None:
                raise bad_request(why, param=key, code="unsupported_parameter")


def _priority(body: dict[str, Any]) -> None:
    """The request's lane by its `priority` (`core.lanes`: 1 or more is bulk)."""
    try:
        lanes.mark(body.get("priority"))
    except ValueError as e:
        raise bad_request(str(e), param="priority", code="invalid_value") from None


def _texts(body: dict[str, Any], limits: Limits) -> list[Any]:
    texts, contents = body.get("texts"), body.get("inputs")
    if texts is not None and contents is not None:
        raise bad_request("pass texts or inputs, not both", param="inputs", code="conflict")
    if texts is None and contents is None:
        raise bad_request("'texts' is required", param="texts", code="missing_required_parameter")
    param = "texts" if texts is not None else "inputs"
    value = texts if texts is not None else contents
    if not isinstance(value, list) or not value:
        raise bad_request(f"{param!r} must be a non-empty list", param=param, code="invalid_type")
    if len(value) > limits.max_inputs:
        raise bad_request(
            f"{param!r} has {len(value)} items, over the limit of {limits.max_inputs} per request",
            param=param,
            code="too_many_inputs",
        )
    return value if texts is not None else [_content_text(c, i) for i, c in enumerate(value)]


def _content_text(item: Any, i: int) -> str:
    """One `inputs` item, `{"content": [{"type": "text", "text": ...}, ...]}`: its text parts
    joined with a space (images are refused)."""
    content = item.get("content") if isinstance(item, dict) else None
    if not isinstance(content, list) or not content:
        raise bad_request(
            f"inputs[{i}] must be an object with a non-empty content list",
            param="inputs",
            code="invalid_type",
        )
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            raise bad_request(
                f"inputs[{i}] holds a part that is not text; this server embeds text only",
                param="inputs",
            )
        if not isinstance(part.get("text"), str):
            raise bad_request(
                f"inputs[{i}]: a text part's text must be a string",
                param="inputs",
                code="invalid_type",
            )
        parts.append(part["text"])
    return " ".join(parts)


def _prompt(input_type: Any, inputs: InputPreparer) -> dict[str, Any]:
    """Our prompt option for Cohere's `input_type`."""
    if input_type is None:
        return {}
    if input_type not in INPUT_TYPES:
        raise bad_request(
            f"input_type must be one of {', '.join(INPUT_TYPES)}; got {input_type!r}",
            param="input_type",
        )
    if input_type == "search_query":
        return {"input_type": "query"}
    if input_type == "search_document":
        return {"input_type": "document"}
    # classification, clustering: the folder's prompt of that name, else its default
    return {"prompt_name": input_type} if input_type in inputs.spec.prompts else {}


def _embedding_types(value: Any) -> list[str]:
    if value is None:
        return ["float"]
    if not isinstance(value, list) or not value:
        raise bad_request(
            "embedding_types must be a non-empty list", param="embedding_types", code="invalid_type"
        )
    for kind in value:
        if kind not in EMBEDDING_TYPES:
            raise bad_request(
                f"embedding_types holds {kind!r}; use {', '.join(EMBEDDING_TYPES)}",
                param="embedding_types",
            )
    return list(dict.fromkeys(value))


def parse_embed(body: Any, limits: Limits, inputs: InputPreparer) -> CohereEmbedJob:
    _check_supported(body)
    body = check_object(body, EMBED_FIELDS)
    check_model(body, limits)
    _priority(body)
    texts = _texts(body, limits)
    truncate = body.get("truncate")
    if truncate is not None and (not isinstance(truncate, str) or truncate not in TRUNCATE):
        raise bad_request(
            f"truncate must be NONE, START or END; got {truncate!r}", param="truncate"
        )
    options = inputs.options(
        truncate=TRUNCATE[truncate or "END"], **_prompt(body.get("input_type"), inputs)
    )
    dimensions = body.get("output_dimension")
    heads = {
        kind: inputs.head(dimensions, True, OUTPUT_DTYPE.get(kind, kind))
        for kind in _embedding_types(body.get("embedding_types"))
    }
    width = next(iter(heads.values())).dimensions
    rows = inputs.head(width, False, "float32")  # the one run's rows: truncated, un-normalized
    return CohereEmbedJob(EmbedJob(texts, options, rows, "float"), heads, texts)


def embed_body(rows: np.ndarray, job: CohereEmbedJob, num_tokens: int) -> dict[str, Any]:
    embeddings: dict[str, Any] = {}
    for kind, head in job.heads.items():
        encoded = head.apply(rows)
        embeddings[kind] = [to_base64(r) for r in encoded] if kind == "base64" else list(encoded)
    return {
        "id": str(uuid.uuid4()),
        "embeddings": embeddings,
        "texts": job.texts,
        "meta": _meta({"input_tokens": num_tokens}),
        "response_type": "embeddings_by_type",
    }


def parse_rerank(body: Any, limits: Limits) -> tuple[ScoreJob, int | None]:
    _check_supported(body)
    body = check_object(body, RERANK_FIELDS)
    check_model(body, limits)
    _priority(body)
    for key in ("query", "documents"):
        if key not in body:
            raise bad_request(f"{key!r} is required", param=key, code="missing_required_parameter")
    top_n = check_top_n(body.get("top_n"))
    docs = documents_of(body["documents"], "documents", limits)
    return ScoreJob([(body["query"], docs)], RERANK_TRUNCATE, None), top_n


def rerank_body(scores: np.ndarray, top_n: int | None) -> dict[str, Any]:
    results = [{"index": i, "relevance_score": float(scores[i])} for i in ranked(scores, top_n)]
    return {
        "id": str(uuid.uuid4()),
        "results": results,
        "meta": _meta({"search_units": 1}),
    }


def _meta(billed: dict[str, int]) -> dict[str, Any]:
    return {"api_version": {"version": "2"}, "billed_units": billed}
