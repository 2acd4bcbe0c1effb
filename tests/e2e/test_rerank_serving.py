"""Scoring over HTTP with real processes: `embedserve serve` on a cross-encoder folder (random
weights, the ms-marco MiniLM shape) and on the bundled embedding model, plain HTTP requests in
the Cohere, TEI and vLLM shapes, answers checked against the offline `Scorer`."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.scorer import Scorer
from tests.data.texts import RERANK_DOCS, RERANK_QUERY
from tests.e2e.conftest import Proc

QUERY = RERANK_QUERY
DOCS = RERANK_DOCS[:4]


def post(url: str, path: str, body: Any) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ms-marco-serve")
    return make_checkpoint(out, arch="ms-marco-minilm-l6", dtype="float32", seed=5, overwrite=True)


@pytest.fixture(scope="module", params=["python", "native"])
def reranker_url(request: pytest.FixtureRequest, cross_encoder: Path) -> Iterator[str]:
    """`serve`, then `serve --native` (Ivy answers the plain scoring bodies itself, the Python
    front the rest): every test of this module holds both to the same answers and errors."""
    native = ["--native"] if request.param == "native" else ["--no-native"]
    # small parts, so a query with many documents is split across server calls
    proc = Proc("serve", *native, "--model", str(cross_encoder), "--port", "0", "--device", "cpu",
                "--dtype", "float32", "--served-model-name", "ms-marco", "--chunk-tokens", "256")  # fmt: skip
    try:
        yield proc.wait_for(r"embedserve: serving \S+ at (\S+)").group(1)
    finally:
        proc.stop()


def test_cohere_shape_rerank_matches_the_offline_scorer(
    reranker_url: str, cross_encoder: Path
) -> None:
    want = Scorer(cross_encoder, device="cpu", dtype="float32").score(QUERY, DOCS)
    body = {"model": "ms-marco", "query": QUERY, "documents": DOCS, "top_n": 3,
            "return_documents": True}  # fmt: skip
    status, reply = post(reranker_url, "/v1/rerank", body)
    assert status == 200, reply
    results = reply["results"]
    assert [r["index"] for r in results] == list(np.argsort(-want, kind="stable")[:3])
    for r in results:
        assert r["relevance_score"] == pytest.approx(float(want[r["index"]]), abs=1e-5)
        assert r["document"] == {"text": DOCS[r["index"]]}
    assert reply["model"] == "ms-marco" and reply["usage"]["prompt_tokens"] > 0
    # documents as {"text": ...} objects, no documents returned by default
    status, reply = post(
        reranker_url, "/v1/rerank", {"query": QUERY, "documents": [{"text": d} for d in DOCS]}
    )
    assert status == 200 and len(reply["results"]) == 4 and "document" not in reply["results"][0]


def test_many_documents_split_across_calls_come_back_in_order(
    reranker_url: str, cross_encoder: Path
) -> None:
    docs = [f"document {i}: " + "vector search ranks documents " * (i % 9) for i in range(60)]
    want = Scorer(cross_encoder, device="cpu", dtype="float32").score(QUERY, docs)
    status, reply = post(reranker_url, "/v1/score", {"text_1": QUERY, "text_2": docs})
    assert status == 200, reply
    got = np.array([d["score"] for d in reply["data"]])
    assert [d["index"] for d in reply["data"]] == list(range(60))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_tei_shape_rerank_and_raw_scores(reranker_url: str, cross_encoder: Path) -> None:
    raw = Scorer(cross_encoder, device="cpu", dtype="float32").score(QUERY, DOCS, raw=True)
    status, reply = post(
        reranker_url, "/rerank", {"query": QUERY, "texts": DOCS, "return_text": True}
    )
    assert status == 200, reply
    assert [r["index"] for r in reply] == list(np.argsort(-raw, kind="stable"))
    for r in reply:  # TEI's convention: sigmoid of the logit unless raw_scores
        assert r["score"] == pytest.approx(float(1 / (1 + np.exp(-raw[r["index"]]))), abs=1e-5)
        assert r["text"] == DOCS[r["index"]]
    status, reply = post(
        reranker_url, "/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True}
    )
    assert status == 200
    assert {r["index"]: r["score"] for r in reply} == pytest.approx(
        dict(enumerate(raw.tolist())), abs=1e-5
    )


def test_vllm_shape_pairs_in_order(reranker_url: str, cross_encoder: Path) -> None:
    scorer = Scorer(cross_encoder, device="cpu", dtype="float32")
    queries = [QUERY, QUERY, "weather in lisbon"]
    status, reply = post(reranker_url, "/v1/score", {"text_1": queries, "text_2": DOCS[:3]})
    assert status == 200, reply
    want = [float(scorer.score(q, [d])[0]) for q, d in zip(queries, DOCS[:3], strict=True)]
    assert [d["score"] for d in reply["data"]] == pytest.approx(want, abs=1e-5)


def test_models_and_the_wrong_task(reranker_url: str) -> None:
    with urllib.request.urlopen(reranker_url + "/v1/models", timeout=30) as reply:
        model = json.loads(reply.read())["data"][0]
    assert (model["id"], model["task"], model["scoring"]) == ("ms-marco", "score", "cross-encoder")
    status, reply = post(reranker_url, "/v1/embeddings", {"input": "hello"})
    assert status == 400 and "reranker" in reply["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/v1/rerank", {"query": QUERY, "documents": []}, "documents is an empty list"),
        ("/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n must be a positive"),
        ("/v1/rerank", {"documents": DOCS}, "'query' is required"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a", 5]}, r"documents[1] must be a string"),
        ("/v1/rerank", {"query": "", "documents": DOCS}, "query is an empty string"),
        (
            "/v1/rerank",
            {"query": QUERY, "documents": DOCS, "top": 1},
            "unrecognized request argument",
        ),
        (
            "/v1/rerank",
            {"query": QUERY, "documents": ["x " * 600], "truncate": False},
            "documents[0]",
        ),
        ("/v1/rerank", {"query": QUERY, "documents": DOCS, "model": "other"}, "not served here"),
        (
            "/rerank",
            {"query": QUERY, "texts": DOCS, "truncation_direction": "Up"},
            "truncation_direction",
        ),
        ("/v1/score", {"text_1": [QUERY, QUERY], "text_2": DOCS}, "text_1 has 2 items"),
    ],
)
def test_bad_scoring_requests(reranker_url: str, path: str, body: dict, words: str) -> None:
    status, reply = post(reranker_url, path, body)
    assert status in (400, 404), reply
    assert words in reply["error"]["message"]


def test_an_over_long_pair_with_truncate_is_answered(reranker_url: str) -> None:
    body = {"query": QUERY, "documents": ["x " * 600, DOCS[0]], "truncate": "end"}
    status, reply = post(reranker_url, "/v1/rerank", body)
    assert status == 200 and len(reply["results"]) == 2


def test_v1_rerank_cuts_an_over_long_document_unless_told_not_to(reranker_url: str) -> None:
    """Faults IV: Cohere's rerank API cuts long documents, and its v1 client raised on our 400;
    `truncate: false` still refuses, naming the document."""
    docs = ["x " * 600, DOCS[0]]
    status, cut = post(reranker_url, "/v1/rerank", {"query": QUERY, "documents": docs})
    assert status == 200, cut
    _, asked = post(reranker_url, "/v1/rerank", {"query": QUERY, "documents": docs,
                                                 "truncate": "end"})  # fmt: skip
    # The same cut: the same tokens billed and the same order. The scores are compared as the
    # offline ones are above: the two requests' parts may meet other parts in different engine
    # batches, and fp32 sums over other batch shapes differ in the last bits.
    assert cut["usage"] == asked["usage"]
    assert [r["index"] for r in cut["results"]] == [r["index"] for r in asked["results"]]
    for c, a in zip(cut["results"], asked["results"], strict=True):
        assert c["relevance_score"] == pytest.approx(a["relevance_score"], abs=1e-5)
    status, refused = post(
        reranker_url, "/v1/rerank", {"query": QUERY, "documents": docs, "truncate": False}
    )
    assert status == 400 and "documents[0]" in refused["error"]["message"]


def test_an_embedding_model_reranks_by_cosine(served: str) -> None:
    """The bundled embedding model behind /v1/rerank: cosine of query and document vectors."""
    want = Scorer("minilm", device="cpu", dtype="float32").score(QUERY, DOCS)
    status, reply = post(served, "/v1/rerank", {"query": QUERY, "documents": DOCS})
    assert status == 200, reply
    got = {r["index"]: r["relevance_score"] for r in reply["results"]}
    assert got == pytest.approx(dict(enumerate(want.tolist())), abs=1e-5)
    # an option only a reranker has: a clear 400
    status, reply = post(served, "/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True})
    assert status == 400 and "raw_scores" in reply["error"]["message"]
