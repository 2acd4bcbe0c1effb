"""The scoring routes refuse a query or document with no token of its own ("\u0000") as they
refuse "": a 400 in the route's shape (OpenAI's, `/rerank`'s too: `gateway.dropin`) naming the field the caller sent and its index, from a
cross-encoder (which gave a 400 blaming the tokenizer's pair template for the document, and
scored the query) and from an embedding model scoring by cosine (which named `input[i]`, no
field of these routes). Through the app, with the real request core and fake servers."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from embedserve.core.inputs import InputPreparer
from embedserve.core.pairs import PairPreparer
from embedserve.gateway.app import GatewayApp
from embedserve.gateway.pipeline import Pipeline, PipelineLimits
from embedserve.gateway.requests import Limits
from embedserve.loading.spec import ScoreSpec
from tests.gateway.test_dropin import call
from tests.gateway.test_pipeline import CountingReplicas

Q = "what is a vector database"
EMPTY = "is empty after the tokenizer's normalization"
# (route, body, the field named, how the message begins)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "/v1/rerank",
        {"query": Q, "documents": ["a document", "\u0000"]},
        "documents",
        "documents[1]",
    ),
    ("/v1/rerank", {"query": "\u0000", "documents": ["a document"]}, "query", "query"),
    ("/v1/rerank", {"query": Q, "documents": [{"text": "\u200b"}]}, "documents", "documents[0]"),
    ("/rerank", {"query": Q, "texts": ["a", "b", "\x01 \x7f"]}, "texts", "texts[2]"),
    ("/rerank", {"query": "\u0000", "texts": ["a"]}, "query", "query"),
    ("/v1/score", {"text_1": Q, "text_2": ["a", "b", "\u0000"]}, "text_2", "text_2[2]"),
    ("/v1/score", {"text_1": "\u0000", "text_2": ["a", "b"]}, "text_1", "text_1"),
    # pairs in groups of one text_1: the index is the pair's in the request
    ("/v1/score", {"text_1": [Q, Q, "\u0000"], "text_2": ["a", "b", "c"]}, "text_1", "text_1[2]"),
    ("/v1/score", {"text_1": [Q, "x", "x"], "text_2": ["a", "b", "\u0000"]}, "text_2", "text_2[2]"),
]


def app(inputs: InputPreparer, cross_encoder: bool) -> GatewayApp:
    pairs = None
    if cross_encoder:  # MiniLM's WordPiece and pair template are ms-marco-MiniLM's
        spec = dataclasses.replace(inputs.spec, score=ScoreSpec("classifier", "sigmoid"))
        pairs = PairPreparer(spec, inputs.tokenizer)
    limits = Limits(hidden_size=384, max_inputs=8, model_names=("m",), task="score")
    pipeline = Pipeline(inputs, CountingReplicas(), PipelineLimits(10_000, 2048), pairs)  # type: ignore[arg-type]
    made = GatewayApp(lambda: pipeline, limits, max_body_bytes=100_000)
    made.pipeline = pipeline
    return made


@pytest.mark.parametrize("cross_encoder", [True, False], ids=["cross-encoder", "bi-encoder"])
@pytest.mark.parametrize(("path", "body", "param", "where"), CASES)
def test_a_text_with_no_token_of_its_own_is_refused_naming_the_field(
    inputs: InputPreparer,
    cross_encoder: bool,
    path: str,
    body: dict[str, Any],
    param: str,
    where: str,
) -> None:
    status, _, raw = call(app(inputs, cross_encoder), "POST", path, body)
    answer = json.loads(raw)
    assert status == 400, answer
    error = answer["error"]
    assert (error["param"], error["code"]) == (param, "invalid_value"), error
    assert error["message"].startswith(f"{where} {EMPTY}"), error


@pytest.mark.parametrize("cross_encoder", [True, False], ids=["cross-encoder", "bi-encoder"])
def test_texts_with_tokens_are_scored(inputs: InputPreparer, cross_encoder: bool) -> None:
    made = app(inputs, cross_encoder)
    body = {"query": "\u0000" + Q, "documents": ["a", "\u0000b", "!"]}
    status, _, raw = call(made, "POST", "/v1/rerank", body)
    assert status == 200 and len(json.loads(raw)["results"]) == 3, raw
    status, _, raw = call(made, "POST", "/v1/score", {"text_1": [Q, "x"], "text_2": ["a", "b"]})
    assert status == 200 and len(json.loads(raw)["data"]) == 2, raw


def test_a_bi_encoder_names_an_over_long_text_as_sent(inputs: InputPreparer) -> None:
    body = {"query": Q, "texts": ["a", "word " * 600]}
    status, _, raw = call(app(inputs, cross_encoder=False), "POST", "/rerank", body)
    error = json.loads(raw)["error"]
    assert status == 400 and (error["param"], error["code"]) == ("texts", "context_length_exceeded")
    assert error["message"].startswith("texts[1] has 602 tokens, over this model's limit of 256")


@pytest.mark.parametrize("cross_encoder", [True, False], ids=["cross-encoder", "bi-encoder"])
def test_tei_grpc_rerank_names_the_text_too(inputs: InputPreparer, cross_encoder: bool) -> None:
    """TEI gRPC's Rerank goes through `/rerank`'s parser and pipeline: the same refusal (an
    INVALID_ARGUMENT by its 400), naming `texts[i]`; a text with tokens is ranked."""
    import asyncio
    from types import SimpleNamespace

    from embedserve.contract import tei
    from embedserve.errors import InputError
    from embedserve.gateway.tei_grpc import TeiGrpc

    made = app(inputs, cross_encoder)
    model = SimpleNamespace(limits=made.served.models[0].limits, started=lambda: made.pipeline)
    grpc_api = object.__new__(TeiGrpc)
    grpc_api.app = SimpleNamespace(served=SimpleNamespace(pick=lambda data, task: model),
                                   metrics=made.metrics)  # type: ignore[assignment]  # fmt: skip
    request = tei.message("RerankRequest")(query=Q, texts=["a", "\u0000"])
    with pytest.raises(InputError, match=rf"^texts\[1\] {EMPTY}") as caught:
        asyncio.run(grpc_api.rerank(request))
    assert caught.value.param == "texts"
    answer = asyncio.run(grpc_api.rerank(tei.message("RerankRequest")(query=Q, texts=["a", "b"])))
    assert sorted(rank.index for rank in answer.ranks) == [0, 1]
