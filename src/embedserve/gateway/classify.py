"""Sequence classification over HTTP, in the shapes TEI's and vLLM's clients send.

- `POST /predict` (text-embeddings-inference): `inputs` (a text, a pair `[a, b]`, or a list of
  texts and pairs; as in TEI a top-level list of exactly two strings is one pair), `raw_scores`
  (the logits instead of probabilities), `truncate` (a bool) and `truncation_direction`, and
  `parameters` (what `huggingface_hub.InferenceClient.text_classification` sends: `top_k`,
  `function_to_apply` "softmax" | "sigmoid" | "none"). Answer: per input, `{"score", "label"}`
  by descending score; one input gives one such list, a list of inputs a list of them.
- `POST /classify` (vLLM): `model`, `input` (a text or a list), `truncate`, `user`. Answer: a list
  object whose `data` holds, per input, `index`, the top `label`, `probs` (in label order) and
  `num_classes`, with `usage`.

Probabilities are the folder's activation (`labels.LabelSpec`: softmax, or sigmoid per label for
a multi-label classifier); the servers return the logits (raw rows) and the gateway applies it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from embedserve.core.classify import ClassifyPreparer, PreparedClassify, is_pair
from embedserve.core.pairs import check_top_n
from embedserve.gateway.errors import ApiError, bad_request
from embedserve.gateway.jsonio import dumps
from embedserve.gateway.models import CLASSIFY
from embedserve.gateway.requests import Limits, check_model, check_object, optional_string
from embedserve.gateway.scoring import flag, tei_truncate
from embedserve.gateway.transport import Answer
from embedserve.loading.labels import LabelSpec

if TYPE_CHECKING:
    from embedserve.gateway.context import RouteContext
    from embedserve.gateway.pipeline import Pipeline

JSON = b"application/json"
PREDICT_FIELDS = frozenset(
    {"inputs", "raw_scores", "truncate", "truncation_direction", "parameters", "model"}
)
PREDICT_PARAMETERS = frozenset({"top_k", "function_to_apply"})
CLASSIFY_FIELDS = frozenset({"model", "input", "truncate", "user"})
FUNCTIONS = ("softmax", "sigmoid", "none")


@dataclass(frozen=True)
class ClassifyJob:
    inputs: Any  # as sent (a TEI pair at the top already wrapped in a list); the core checks it
    single: bool  # answer one input's list, not a list of them
    truncate: Any
    function: str | None = None  # None: the folder's activation; else one of FUNCTIONS
    top_k: int | None = None


def _count(inputs: Any, param: str, max_inputs: int) -> None:
    if isinstance(inputs, list) and len(inputs) > max_inputs:
        raise bad_request(
            f"{param} has {len(inputs)} items, over the limit of {max_inputs}",
            param=param,
            code="too_many_inputs",
        )


def _required(body: dict[str, Any], key: str) -> Any:
    if body.get(key) is None:
        raise bad_request(f"{key!r} is required", param=key, code="missing_required_parameter")
    return body[key]


def parse_predict(body: Any, limits: Limits) -> ClassifyJob:
    """`/predict` (TEI's shape; see the module docstring)."""
    body = check_object(body, PREDICT_FIELDS)
    check_model(body, limits)
    inputs = _required(body, "inputs")
    single = isinstance(inputs, str) or is_pair(inputs)
    if is_pair(inputs):  # TEI: `["a", "b"]` is one pair
        inputs = [inputs]
    _count(inputs, "inputs", limits.max_inputs)
    params = body.get("parameters") or {}
    params = check_object(params, PREDICT_PARAMETERS)
    function = optional_string(params, "function_to_apply")
    if function is not None and function not in FUNCTIONS:
        raise bad_request(
            f"function_to_apply must be one of {', '.join(FUNCTIONS)}, got {function!r}",
            param="function_to_apply",
        )
    if flag(body, "raw_scores"):
        function = "none"
    top_k = check_top_n(params.get("top_k"))
    return ClassifyJob(inputs, single, tei_truncate(body), function, top_k)


def parse_classify(body: Any, limits: Limits) -> ClassifyJob:
    """`/classify` (vLLM's shape; see the module docstring)."""
    body = check_object(body, CLASSIFY_FIELDS)
    check_model(body, limits)
    optional_string(body, "user")
    inputs = _required(body, "input")
    _count(inputs, "input", limits.max_inputs)
    return ClassifyJob(inputs, isinstance(inputs, str), body.get("truncate"))


def activate(labels: LabelSpec, logits: np.ndarray, function: str | None) -> np.ndarray:
    """The scores a job asks for: the folder's activation, a named one, or the logits."""
    if function is None:
        return labels.activate(logits)
    if function == "none":
        return np.asarray(logits, dtype=np.float32)
    return LabelSpec(labels.labels, function).activate(logits)  # type: ignore[arg-type]


class ClassifyRoutes:
    """The two routes' handlers, on the pipeline of the request's classifier (its servers return
    the logits)."""

    def __init__(self, app: RouteContext) -> None:
        self.app = app
        self._preparers: dict[str, ClassifyPreparer] = {}  # by served model name

    def _job(self, body: bytes, parse: Any) -> tuple[str, ClassifyPreparer, Pipeline, ClassifyJob]:
        name, limits, pipeline, data = self.app.served_for(body, CLASSIFY)
        return name, self.preparer(name, pipeline), pipeline, parse(data, limits)

    def preparer(self, name: str, pipeline: Pipeline) -> ClassifyPreparer:
        """The request core of the served classifier `name` (made on its first request)."""
        preparer = self._preparers.get(name)
        if preparer is None:
            preparer = ClassifyPreparer(pipeline.inputs.spec, pipeline.inputs.tokenizer)
            self._preparers[name] = preparer
        return preparer

    async def scores(
        self, preparer: ClassifyPreparer, pipeline: Pipeline, job: ClassifyJob
    ) -> tuple[np.ndarray, int]:
        prepared: PreparedClassify = preparer.prepare(job.inputs, truncate=job.truncate)
        logits, num_tokens = await pipeline.raw_rows(prepared.seqs, prepared.second_segment)
        if logits.shape[1] != preparer.labels.num_labels:
            raise ApiError(500, f"replica answered {logits.shape[1]} logits per input")
        self.app.metrics.count(num_tokens, len(prepared.seqs))
        return activate(preparer.labels, logits, job.function), num_tokens

    async def predict(self, body: bytes) -> Answer:
        _, preparer, pipeline, job = self._job(body, parse_predict)
        scores, _ = await self.scores(preparer, pipeline, job)
        preds = preparer.predictions(scores, job.top_k)
        out = [[{"score": p.score, "label": p.label} for p in row] for row in preds]
        return 200, JSON, dumps(out[0] if job.single else out)

    async def classify(self, body: bytes) -> Answer:
        name, preparer, pipeline, job = self._job(body, parse_classify)
        probs, num_tokens = await self.scores(preparer, pipeline, job)
        labels = preparer.labels.labels
        data = [
            {
                "index": i,
                "label": labels[int(np.argmax(row))],
                "probs": row.tolist(),
                "num_classes": len(labels),
            }
            for i, row in enumerate(probs)
        ]
        body_out = {
            "id": f"classify-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": name,
            "data": data,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        }
        return 200, JSON, dumps(body_out)
