"""The scoring APIs in the shapes users already send, read into one `ScoreJob`, and their bodies.

- `POST /v1/rerank` (Cohere / Jina): `query`, `documents` (strings or `{"text": ...}`),
  `top_n`, `return_documents`; results sorted by `relevance_score` with their original `index`.
- `POST /rerank` (text-embeddings-inference): `query`, `texts`, `raw_scores`, `return_text`,
  `truncate` (a bool) and `truncation_direction`; a sorted list of `{index, score}`.
- `POST /v1/score` (vLLM): `text_1` (one or many) against `text_2` (many): one pair per
  `text_2` with a single `text_1`, else pairs in order; `data` of `{index, score}` in pair order.

Scores: a reranker's activation of its logit (sentence-transformers CrossEncoder's convention,
the folder's), TEI's sigmoid of it on `/rerank` (its raw logit with `raw_scores`); an embedding
model's cosine similarity; a sparse or multi-vector model's own score
(`gateway.output_bodies`; bge-m3 takes `weights` on `/v1/rerank` and `/v1/score`). Only what is particular to HTTP is checked here; the query and
documents go to the request core (`pairs`) as sent.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.core.pairs import Fields, check_top_n, ranked, read_documents
from embedserve.gateway.errors import bad_request
from embedserve.gateway.requests import Limits, check_model, check_object, optional_string
from embedserve.loading.retrieval_kinds import KIND_BY_NAME

RERANK_FIELDS = frozenset(
    {"model", "query", "documents", "top_n", "return_documents", "truncate", "instruction",
     "weights"}
)  # fmt: skip
TEI_RERANK_FIELDS = frozenset(
    {"query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction", "model"}
)
SCORE_FIELDS = frozenset(
    {"model", "text_1", "text_2", "truncate", "instruction", "user", "weights"}
)


@dataclass(frozen=True)
class ScoreJob:
    groups: list[tuple[Any, Any]]  # (query, documents) as sent, scored in this order
    truncate: Any  # False | "end" | "start" (the core checks it)
    instruction: Any  # an LLM reranker's (or a Qwen3 embedder's query) instruction
    scores: str = "model"  # "model": the folder's activation; "sigmoid"; "raw": the logit
    weights: Any = None  # bge-m3's (dense, sparse, colbert) weights, as sent (`late_plan`)
    names: tuple[str, str] = ("query", "documents")  # the route's fields (`pairs.Fields`)
    listed: bool = False  # vLLM's `text_1` a list: each group's query is named by its index

    @property
    def num_documents(self) -> int:
        return sum(len(docs) for _, docs in self.groups)

    def fields(self) -> list[Fields]:
        """Per group, what its errors call its query and documents (their place in the
        request's lists: vLLM's pairs go in groups of one `text_1`)."""
        out, first = [], 0
        for _, docs in self.groups:
            out.append(Fields(*self.names, first=first, listed=self.listed))
            first += len(docs)
        return out


def flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(
            f"{key!r} must be true or false, got {type(value).__name__}",
            param=key,
            code="invalid_type",
        )
    return value


def documents_of(value: Any, param: str, limits: Limits) -> list[str]:
    docs = read_documents(value, param)
    if len(docs) > limits.max_inputs:
        raise bad_request(
            f"{param} has {len(docs)} items, over the limit of {limits.max_inputs}",
            param=param,
            code="too_many_inputs",
        )
    return docs


# what `/v1/rerank` does with an over-long document when the body does not say (`/v2/rerank`
# always cuts, as Cohere does)
RERANK_TRUNCATE = "end"


def parse_rerank(body: Any, limits: Limits) -> tuple[ScoreJob, int | None, bool]:
    """`/v1/rerank`: the job, `top_n` (None: all) and `return_documents`."""
    body = check_object(body, RERANK_FIELDS)
    check_model(body, limits)
    if "query" not in body:
        raise bad_request("'query' is required", param="query", code="missing_required_parameter")
    if "documents" not in body:
        raise bad_request(
            "'documents' is required", param="documents", code="missing_required_parameter"
        )
    top_n = check_top_n(body.get("top_n"))
    docs = documents_of(body["documents"], "documents", limits)
    # NOTE: Cohere's rerank API cuts long documents rather than refusing them, and its clients
    # (v1 among them) expect an answer: an over-long document keeps its beginning unless the
    # body says otherwise (`"truncate": false` refuses it, as before)
    truncate = body.get("truncate", RERANK_TRUNCATE)
    job = ScoreJob(
        [(body["query"], docs)], truncate, body.get("instruction"), weights=_weights(body, limits)
    )
    return job, top_n, flag(body, "return_documents")


def tei_truncate(body: dict[str, Any]) -> str | bool:
    """TEI's `truncate` (a bool) and `truncation_direction` as our `truncate`: "Right" cuts the
    end off (keeps the beginning: "end"), "Left" cuts the beginning off ("start"); also
    lowercase, as `huggingface_hub` sends them."""
    direction = optional_string(body, "truncation_direction") or "Right"
    if direction not in ("Right", "Left", "right", "left"):
        raise bad_request(
            f'truncation_direction must be "Right" or "Left", got {direction!r}',
            param="truncation_direction",
            code="invalid_value",
        )
    cut = "end" if direction in ("Right", "right") else "start"
    return cut if flag(body, "truncate") else False


def parse_tei_rerank(body: Any, limits: Limits) -> tuple[ScoreJob, bool]:
    """`/rerank` (TEI's shape): the job and `return_text`."""
    body = check_object(body, TEI_RERANK_FIELDS)
    check_model(body, limits)
    if "query" not in body:
        raise bad_request("'query' is required", param="query", code="missing_required_parameter")
    if "texts" not in body:
        raise bad_request("'texts' is required", param="texts", code="missing_required_parameter")
    truncate = tei_truncate(body)
    scores = "raw" if flag(body, "raw_scores") else "sigmoid"
    docs = documents_of(body["texts"], "texts", limits)
    job = ScoreJob([(body["query"], docs)], truncate, None, scores, names=("query", "texts"))
    return job, flag(body, "return_text")


def parse_score(body: Any, limits: Limits) -> ScoreJob:
    """`/v1/score` (vLLM's shape)."""
    body = check_object(body, SCORE_FIELDS)
    check_model(body, limits)
    optional_string(body, "user")
    for key in ("text_1", "text_2"):
        if key not in body:
            raise bad_request(f"{key!r} is required", param=key, code="missing_required_parameter")
    first, second = body["text_1"], body["text_2"]
    seconds = documents_of([second] if isinstance(second, str) else second, "text_2", limits)
    if isinstance(first, list) and len(first) != 1:
        if len(first) != len(seconds):
            raise bad_request(
                f"text_1 has {len(first)} items and text_2 {len(seconds)}: pass one text_1, "
                "or as many as text_2",
                param="text_1",
                code="invalid_value",
            )
        firsts = documents_of(first, "text_1", limits)
        # consecutive pairs that share a text_1 go together
        groups: list[tuple[Any, Any]] = []
        for q, d in zip(firsts, seconds, strict=True):
            if groups and groups[-1][0] == q:
                groups[-1][1].append(d)
            else:
                groups.append((q, [d]))
    else:
        groups = [(first[0] if isinstance(first, list) else first, seconds)]
    return ScoreJob(
        groups, body.get("truncate"), body.get("instruction"), weights=_weights(body, limits),
        names=("text_1", "text_2"), listed=isinstance(first, list),
    )  # fmt: skip


def _weights(body: dict[str, Any], limits: Limits) -> Any:
    """bge-m3's `weights`, as sent (`late_plan` checks the numbers); a 400 on any other model."""
    weights = body.get("weights")
    kind = KIND_BY_NAME.get(limits.retrieval or "")
    if weights is not None and (kind is None or not kind.score_weights):
        raise bad_request(
            "weights are bge-m3's (dense, sparse, colbert) score weights; this model takes none",
            param="weights",
            code="invalid_value",
        )
    return weights


def _usage(num_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": num_tokens, "total_tokens": num_tokens}


def rerank_body(
    scores: np.ndarray,
    docs: list[str],
    top_n: int | None,
    return_documents: bool,
    model: str,
    num_tokens: int,
) -> dict[str, Any]:
    results = []
    for i in ranked(scores, top_n):
        result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if return_documents:
            result["document"] = {"text": docs[i]}
        results.append(result)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": model,
        "results": results,
        "usage": _usage(num_tokens),
    }


def tei_rerank_body(scores: np.ndarray, texts: list[str], return_text: bool) -> list[Any]:
    out = []
    for i in ranked(scores):
        item: dict[str, Any] = {"index": i, "score": float(scores[i])}
        if return_text:
            item["text"] = texts[i]
        out.append(item)
    return out


def score_body(scores: np.ndarray, model: str, num_tokens: int) -> dict[str, Any]:
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)],
        "usage": _usage(num_tokens),
    }
