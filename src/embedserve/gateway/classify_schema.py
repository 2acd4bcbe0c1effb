"""The OpenAPI schemas of `/predict` and `/classify` (`gateway.classify`), which
`gateway.openapi` lists for a sequence classifier only (another model answers them 400)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from embedserve.gateway.classify import FUNCTIONS
from embedserve.gateway.openapi_types import Field, Schema, body, boolean, choice, string
from embedserve.gateway.requests import Limits

TEXT = {"type": "string", "minLength": 1, "pattern": r"\S"}
PAIR = {"type": "array", "items": TEXT, "minItems": 2, "maxItems": 2}


def _prediction_list() -> dict[str, Any]:
    return {"type": "array", "items": {
        "type": "object", "required": ["score", "label"],
        "properties": {"score": {"type": "number"}, "label": {"type": "string"}}}}  # fmt: skip


def predict_request(limits: Limits) -> Schema:
    batch = {"type": "array", "items": {"oneOf": [TEXT, PAIR]}, "minItems": 1,
             "maxItems": limits.max_inputs}  # fmt: skip
    parameters = {"type": "object", "additionalProperties": False, "properties": {
        "top_k": {"type": "integer", "minimum": 1, "nullable": True},
        "function_to_apply": {"type": "string", "enum": list(FUNCTIONS), "nullable": True}}}  # fmt: skip
    return body(
        Field("inputs", {"oneOf": [TEXT, PAIR, batch]}, required=True),
        Field("raw_scores", boolean(default=False)),
        Field("truncate", boolean(default=False)),
        Field("truncation_direction", string(enum=["Right", "Left"])),
        Field("parameters", parameters),
        Field("model", string(enum=limits.model_names)),
    )


def predict_response() -> dict[str, Any]:
    """One input: its predictions; a list of inputs: a list of them."""
    one = _prediction_list()
    return {"oneOf": [one, {"type": "array", "items": one}]}


def classify_request(limits: Limits) -> Schema:
    texts = {"type": "array", "items": TEXT, "minItems": 1, "maxItems": limits.max_inputs}
    return body(
        Field("input", {"oneOf": [TEXT, texts]}, required=True),
        Field("truncate", choice(False, True, "end", "start")),
        Field("user", string()),
        Field("model", string(enum=limits.model_names)),
    )


def classify_response(score_response: dict[str, Any]) -> dict[str, Any]:
    """vLLM's list object (`/v1/score`'s, `score_response`) with classification items."""
    item = {"type": "object", "required": ["index", "label", "probs", "num_classes"],
            "properties": {"index": {"type": "integer", "minimum": 0},
                           "label": {"type": "string"},
                           "probs": {"type": "array", "items": {"type": "number"}},
                           "num_classes": {"type": "integer", "minimum": 2}}}  # fmt: skip
    properties = {**score_response["properties"], "data": {"type": "array", "items": item}}
    return {**score_response, "properties": properties}


def classify_operations(
    limits: Limits, score_answer: Schema, post: Callable[..., Any], errors: dict[str, Any]
) -> dict[tuple[str, str], Any]:
    """The two routes' operations (`openapi.post`'s), for a classifier only. `score_answer`:
    `/v1/score`'s answer, whose list object `/classify` shares."""
    if limits.task != "classify":
        return {}
    return {
        ("POST", "/predict"): post(
            "Each label's score for texts or text pairs (text-embeddings-inference shape), "
            "best first",
            predict_request(limits),
            predict_response(),
            errors,
        ),
        ("POST", "/classify"): post(
            "Each label's probability for texts (vLLM shape), in label order",
            classify_request(limits),
            classify_response(score_answer),
            errors,
        ),
    }
