"""The OpenAPI schemas of `/predict` and `/classify` (`gateway.classify`), which
`gateway.openapi` publishes for a sequence classifier only (another model answers them 400)."""

from __future__ import annotations

from typing import Any

from embedserve.gateway.classify import FUNCTIONS
from embedserve.gateway.requests import Limits

TEXT = {"type": "string", "minLength": 1, "pattern": r"\S"}
PAIR = {"type": "array", "items": TEXT, "minItems": 2, "maxItems": 2}


def _prediction_list() -> dict[str, Any]:
    return {"type": "array", "items": {
        "type": "object", "required": ["score", "label"],
        "properties": {"score": {"type": "number"}, "label": {"type": "string"}}}}  # fmt: skip


def predict_request(limits: Limits) -> dict[str, Any]:
    batch = {"type": "array", "items": {"oneOf": [TEXT, PAIR]}, "minItems": 1,
             "maxItems": limits.max_inputs}  # fmt: skip
    parameters = {"type": "object", "additionalProperties": False, "properties": {
        "top_k": {"type": "integer", "minimum": 1, "nullable": True},
        "function_to_apply": {"type": "string", "enum": list(FUNCTIONS), "nullable": True}}}  # fmt: skip
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["inputs"],
        "properties": {
            "inputs": {"oneOf": [TEXT, PAIR, batch]},
            "raw_scores": {"type": "boolean", "default": False},
            "truncate": {"type": "boolean", "default": False},
            "truncation_direction": {"type": "string", "enum": ["Right", "Left"]},
            "parameters": parameters,
            "model": {"type": "string", "enum": list(limits.model_names)},
        },
    }


def predict_response() -> dict[str, Any]:
    """One input: its predictions; a list of inputs: a list of them."""
    one = _prediction_list()
    return {"oneOf": [one, {"type": "array", "items": one}]}


def classify_request(limits: Limits) -> dict[str, Any]:
    texts = {"type": "array", "items": TEXT, "minItems": 1, "maxItems": limits.max_inputs}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["input"],
        "properties": {
            "input": {"oneOf": [TEXT, texts]},
            "truncate": {"enum": [False, True, "end", "start"]},
            "user": {"type": "string"},
            "model": {"type": "string", "enum": list(limits.model_names)},
        },
    }


def classify_response(score_response: dict[str, Any]) -> dict[str, Any]:
    """vLLM's list object (`/v1/score`'s, `score_response`) with classification items."""
    item = {"type": "object", "required": ["index", "label", "probs", "num_classes"],
            "properties": {"index": {"type": "integer", "minimum": 0},
                           "label": {"type": "string"},
                           "probs": {"type": "array", "items": {"type": "number"}},
                           "num_classes": {"type": "integer", "minimum": 2}}}  # fmt: skip
    properties = {**score_response["properties"], "data": {"type": "array", "items": item}}
    return {**score_response, "properties": properties}


def classify_schemas(limits: Limits, score_response: dict[str, Any]) -> dict[str, Any]:
    """(request, answer) of the two routes, by `openapi`'s schema names; none but for a
    classifier. `score_response`: `/v1/score`'s answer, whose list object `/classify` shares."""
    if limits.task != "classify":
        return {}
    return {
        "predict": (predict_request(limits), predict_response()),
        "classify": (classify_request(limits), classify_response(score_response)),
    }


def classify_paths(post: Any, schemas: dict[str, Any], errors: dict[str, Any]) -> dict[str, Any]:
    """The two routes' entries, when `schemas` holds theirs (`openapi._work_paths`'s `post`)."""
    if "predict" not in schemas:
        return {}
    return {
        "/predict": post(
            "Each label's score for texts or text pairs (text-embeddings-inference shape), "
            "best first",
            "predict",
            errors,
        ),
        "/classify": post(
            "Each label's probability for texts (vLLM shape), in label order",
            "classify",
            errors,
        ),
    }
