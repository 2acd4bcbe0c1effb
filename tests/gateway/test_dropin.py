"""The drop-in routes through the app with a fake pipeline: TEI's error shape on TEI's routes,
the task each model does, the API page (no external URL), GET / (a 404) and the 404's pointers, and
the OpenAPI document's new routes."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import numpy as np
import pytest

from embedserve.core.inputs import InputPreparer
from embedserve.gateway.app import GatewayApp
from embedserve.gateway.cohere import embed_body, parse_embed
from embedserve.gateway.requests import Limits
from embedserve.gateway.tei import cosines, parse_decode, parse_similarity

LIMITS = Limits(hidden_size=384, max_inputs=8, model_names=("minilm",))
RERANKER = Limits(hidden_size=1, max_inputs=8, model_names=("ce",), task="score")


class FakePipeline:
    """Rows of ones (scaled per input), so the routes' shapes can be checked."""

    def __init__(self, inputs: InputPreparer, reranker: bool = False) -> None:
        self.inputs = inputs
        self.pairs = object() if reranker else None

    async def embed(self, job: Any) -> tuple[np.ndarray, int]:
        prepared = self.inputs.prepare(job.inputs, job.options)
        rows = np.ones((len(prepared.seqs), self.inputs.spec.hidden_size), np.float32)
        return job.head.apply(rows * np.arange(1, len(rows) + 1, dtype=np.float32)[:, None]), 5


def call(app: GatewayApp, method: str, path: str, body: Any = None) -> tuple[int, dict, bytes]:
    raw = b"" if body is None else json.dumps(body).encode()
    messages = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path,
             "headers": [(b"content-type", b"application/json")]}  # fmt: skip
    asyncio.run(app(scope, receive, send))
    headers = dict(sent[0]["headers"])
    return sent[0]["status"], headers, sent[1]["body"]


def make_app(inputs: InputPreparer, limits: Limits = LIMITS) -> GatewayApp:
    pipeline = FakePipeline(inputs, reranker=limits.task == "score")
    app = GatewayApp(lambda: pipeline, limits, max_body_bytes=100_000)  # type: ignore[arg-type,return-value]
    app.pipeline = pipeline  # type: ignore[assignment]
    return app


def test_tei_routes_answer_tei_shaped_errors_and_others_openai_shaped(
    inputs: InputPreparer,
) -> None:
    app = make_app(inputs)
    status, _, body = call(app, "POST", "/embed", {"inputs": ""})
    assert status == 400
    assert json.loads(body) == {"error": "input is an empty string", "error_type": "validation"}
    status, _, body = call(app, "POST", "/embed", {"inputs": "x", "truncation_direction": "Up"})
    assert status == 400 and "truncation_direction" in json.loads(body)["error"]
    status, _, body = call(app, "POST", "/v2/embed", {"texts": ["x"], "max_tokens": 3})
    error = json.loads(body)["error"]
    assert (
        status == 400
        and error["code"] == "unsupported_parameter"
        and error["param"] == "max_tokens"
    )


def test_embed_and_similarity_answers(inputs: InputPreparer) -> None:
    app = make_app(inputs)
    status, _, body = call(app, "POST", "/", {"inputs": ["a", "b"], "dimensions": 4})
    rows = np.array(json.loads(body))
    assert status == 200 and rows.shape == (2, 4)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-6)
    similarity = {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}, "parameters": {}}
    status, _, body = call(app, "POST", "/", similarity)
    assert status == 200 and json.loads(body) == pytest.approx([1.0, 1.0])


def test_a_reranker_refuses_the_embedding_routes_naming_what_it_does(
    inputs: InputPreparer,
) -> None:
    app = make_app(inputs, RERANKER)
    for path, body in [("/embed", {"inputs": "x"}), ("/v2/embed", {"texts": ["x"]}),
                       ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}})]:  # fmt: skip
        status, _, raw = call(app, "POST", path, body)
        reply = json.loads(raw)
        message = reply["error"] if path != "/v2/embed" else reply["error"]["message"]
        assert status == 400 and "is a reranker" in message and "/rerank" in message, path


def test_the_api_page_has_no_external_url_and_get_root_points_to_it(
    inputs: InputPreparer,
) -> None:
    app = make_app(inputs)
    for path in ("/docs", "/redoc"):
        status, headers, page = call(app, "GET", path)
        assert status == 200 and headers[b"content-type"].startswith(b"text/html")
        assert b"default-src 'none'" in headers[b"content-security-policy"]
        assert not re.search(rb"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", page), "an external URL"
        assert b'fetch("/openapi.json"' in page
    for path in ("/", "/nowhere"):  # GET /: a 404 as before (POST / is TEI's route)
        status, _, body = call(app, "GET", path)
        error = json.loads(body)["error"]
        assert status == 404 and error["code"] == "not_found"
        assert "/docs" in error["message"] and "/openapi.json" in error["message"]


def test_the_openapi_document_lists_every_route_with_tei_errors_on_tei_routes(
    inputs: InputPreparer,
) -> None:
    app = make_app(inputs)
    doc = json.loads(call(app, "GET", "/openapi.json")[2])
    # the document itself, the old aliases of /v1 routes and GET / (a 404) aside
    unlisted = {"/openapi.json", "/embeddings", "/contextualizedembeddings", "/score"}
    unlisted |= {"/predict", "/classify"}  # listed for a sequence classifier only
    unlisted |= {"/embed_sparse"}  # listed for a model with a sparse output only
    served = {(m.lower(), p) for m, p in app.routes if p not in unlisted} - {("get", "/")}
    listed = {(m, p) for p, item in doc["paths"].items() for m in item}
    assert served == listed
    ref = doc["paths"]["/embed"]["post"]["responses"]["400"]["content"]["application/json"]
    assert ref["schema"]["$ref"] == "#/components/schemas/TeiError"
    reranker_doc = json.loads(call(make_app(inputs, RERANKER), "GET", "/openapi.json")[2])
    assert "texts" in reranker_doc["paths"]["/"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]  # fmt: skip


def test_parsers(inputs: InputPreparer) -> None:
    assert parse_decode({"ids": [1, 2]}, 10) == ([[1, 2]], True)
    assert parse_decode({"ids": [[1], [2]], "skip_special_tokens": False}, 10) == (
        [[1], [2]],
        False,
    )
    job = parse_similarity(
        {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"truncate": True}},
        LIMITS,
        inputs,
    )
    assert job.inputs == ["a", "b"] and job.options.truncate == "end"
    assert cosines(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])) == [0.0, 1.0]
    cohere_job = parse_embed(
        {"inputs": [{"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
         "embedding_types": ["int8", "float", "int8"], "truncate": "START"},
        LIMITS,
        inputs,
    )  # fmt: skip
    assert cohere_job.texts == ["a b"] and list(cohere_job.heads) == ["int8", "float"]
    assert cohere_job.job.options.truncate == "start" and not cohere_job.job.head.normalize
    answer = embed_body(np.full((1, 384), 0.5, np.float32), cohere_job, 3)
    assert answer["embeddings"]["int8"][0].max() == 6  # 127 / sqrt(384) per unit component
    assert answer["meta"]["billed_units"] == {"input_tokens": 3}
