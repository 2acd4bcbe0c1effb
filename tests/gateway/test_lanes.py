"""Priority lanes, the gateway's side (`core.lanes`): each server call carries its request's
lane, by route (scores interactive), size (over `BULK_INPUTS` or `BULK_TOKENS` bulk) and an
explicit `priority` (Cohere's: 1 or more bulk; a bad value a 400 naming the field); calls of two
lanes never merge."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from embedserve.contract import EmbedRequest, EmbedResponse
from embedserve.core import lanes
from embedserve.core.inputs import InputPreparer
from embedserve.gateway.app import GatewayApp
from embedserve.gateway.coalescing import merge, merge_key
from embedserve.gateway.pipeline import Pipeline, PipelineLimits
from embedserve.gateway.requests import Limits
from tests.gateway.test_dropin import call

LIMITS = Limits(hidden_size=384, max_inputs=2048, model_names=("minilm",))


class Replicas:
    """Rows of ones; records each call's lane."""

    def __init__(self) -> None:
        self.lanes: list[int] = []

    async def embed(self, request: Any, num_tokens: int) -> Any:
        self.lanes.append(request.lane)
        out = np.ones((len(request.seqlens), 384), np.float32)
        return EmbedResponse(embeddings=out.tobytes(), shape=list(out.shape), dtype="float32")


def post(inputs: InputPreparer, path: str, payload: Any) -> tuple[int, dict[str, Any], set[int]]:
    """The status, body and the lanes of the server calls of one request."""
    replicas = Replicas()
    limits = PipelineLimits(max_tokens_per_request=1_000_000, part_tokens=2048)
    pipeline = Pipeline(inputs, replicas, limits)  # type: ignore[arg-type]
    app = GatewayApp(lambda: pipeline, LIMITS, max_body_bytes=10_000_000)
    app.pipeline = pipeline
    status, _, body = call(app, "POST", path, payload)
    return status, json.loads(body), set(replicas.lanes)


QUERY = "what is the capital of france"
PASSAGE = " ".join(["a passage of several words about the capital of france"] * 20)  # ~220 tokens


def test_a_query_is_interactive_and_a_large_request_bulk(inputs: InputPreparer) -> None:
    assert post(inputs, "/v1/embeddings", {"input": QUERY})[2] == {lanes.INTERACTIVE}
    # 40 passages of ~220 tokens: over BULK_INPUTS and BULK_TOKENS, every part of it bulk
    status, _, seen = post(inputs, "/v1/embeddings", {"input": [PASSAGE] * 40})
    assert status == 200 and seen == {lanes.BULK}
    status, _, seen = post(inputs, "/embed", {"inputs": [PASSAGE] * 5})  # ~1,100 tokens
    assert status == 200 and seen == {lanes.INTERACTIVE}
    # more inputs than BULK_INPUTS, however short: an indexing client's batch
    status, _, seen = post(inputs, "/embed", {"inputs": [QUERY] * (lanes.BULK_INPUTS + 1)})
    assert status == 200 and seen == {lanes.BULK}
    assert post(inputs, "/embed", {"inputs": [QUERY] * lanes.BULK_INPUTS})[2] == {lanes.INTERACTIVE}


def test_scores_are_interactive_whatever_their_size(inputs: InputPreparer) -> None:
    body = {"query": QUERY, "texts": [PASSAGE] * 40}
    status, _, seen = post(inputs, "/rerank", body)
    assert status == 200 and seen == {lanes.INTERACTIVE}


def test_an_explicit_priority_picks_the_bulk_lane(inputs: InputPreparer) -> None:
    status, _, seen = post(inputs, "/v2/embed", {"texts": [QUERY], "priority": 1})
    assert status == 200 and seen == {lanes.BULK}
    status, _, seen = post(inputs, "/v2/embed", {"texts": [QUERY], "priority": 0})
    assert status == 200 and seen == {lanes.INTERACTIVE}  # 0, Cohere's default: by size
    status, _, seen = post(inputs, "/v2/embed", {"texts": [PASSAGE] * 40, "priority": 0})
    assert status == 200 and seen == {lanes.BULK}
    body = {"query": QUERY, "documents": [PASSAGE], "priority": 3}
    status, _, seen = post(inputs, "/v2/rerank", body)
    assert status == 200 and seen == {lanes.BULK}


@pytest.mark.parametrize("value", [-1, "high", 1.5, True])
def test_a_bad_priority_is_a_400_naming_the_field(inputs: InputPreparer, value: Any) -> None:
    status, body, seen = post(inputs, "/v2/embed", {"texts": [QUERY], "priority": value})
    assert status == 400 and not seen
    assert "'priority' must be an integer >= 0" in body["error"]["message"]
    assert body["error"]["param"] == "priority"


def test_the_rule_alone() -> None:
    assert lanes.by_size(lanes.BULK_TOKENS) == lanes.INTERACTIVE
    assert lanes.by_size(lanes.BULK_TOKENS + 1) == lanes.BULK
    assert lanes.by_size(10, lanes.BULK_INPUTS + 1) == lanes.BULK
    assert lanes.priority_lane(None) is None and lanes.priority_lane(0) is None
    assert lanes.priority_lane(7) == lanes.BULK
    with pytest.raises(ValueError, match="priority"):
        lanes.priority_lane(-2)


def test_calls_of_two_lanes_never_merge() -> None:
    a = EmbedRequest(input_ids=b"\x01\x00\x00\x00", seqlens=[1], lane=lanes.BULK)
    b = EmbedRequest(input_ids=b"\x01\x00\x00\x00", seqlens=[1])
    assert merge_key(a) != merge_key(b)
    assert merge([a, a]).lane == lanes.BULK
