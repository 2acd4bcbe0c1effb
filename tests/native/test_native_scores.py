"""`embedserve serve --native` on a cross-encoder: Ivy answers the plain `/v1/rerank`, `/rerank`,
`/v1/score` and `/v2/rerank` itself (pairs joined by `native/src/ivy/pairs.rs`, the rule the request core
calls too), and its answers equal the Python front's answers to the same request in a shape
Ivy hands over (documents as `{"text": ...}` objects, `text_1` as a list), field for field;
whatever the Python front refuses is still refused there, with its message."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.scorer import Scorer
from tests.e2e.conftest import Proc
from tests.e2e.test_rerank_serving import post
from tests.e2e.test_retrieval_serving import QUERY, TEXTS

pytestmark = pytest.mark.slow

LONG = "the quick brown fox jumps over the lazy dog " * 80  # ~720 tokens: over the 512 limit
DOCS = [*TEXTS, LONG]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = make_checkpoint(
        tmp_path_factory.mktemp("rr") / "rr", arch="ms-marco-minilm-l6", dtype="float32", seed=7
    )
    proc = Proc("serve", "--native", "--model", f"rr={folder}", "--port", "0",
                "--device", "cpu", "--dtype", "float32")  # fmt: skip
    try:
        found = proc.wait_for(r"embedserve: serving rr at (\S+) \(native front: plain (\w+) (\w+)")
        assert found.group(2, 3) == ("scores", "answered"), found.group(0)
        yield found.group(1), folder
    finally:
        proc.stop()


def _objects(docs: list[str]) -> list[dict[str, str]]:
    """The same documents in the shape Ivy hands to the Python front."""
    return [{"text": d} for d in docs]


def _same(native: list[dict[str, Any]], python: list[dict[str, Any]], key: str) -> None:
    assert [r["index"] for r in native] == [r["index"] for r in python]
    np.testing.assert_allclose([r[key] for r in native], [r[key] for r in python], atol=1e-6)
    for n, p in zip(native, python, strict=True):
        assert {k: v for k, v in n.items() if k != key} == {k: v for k, v in p.items() if k != key}


def test_v1_rerank_answers_as_the_python_front(reranker: tuple[str, Path]) -> None:
    url, folder = reranker
    body = {"model": "rr", "query": QUERY, "top_n": 3, "return_documents": True}
    status, native = post(url, "/v1/rerank", {**body, "documents": DOCS})
    status_py, python = post(url, "/v1/rerank", {**body, "documents": _objects(DOCS)})
    assert status == status_py == 200, (native, python)
    _same(native["results"], python["results"], "relevance_score")
    assert native["usage"] == python["usage"] and native["model"] == python["model"] == "rr"
    assert native["id"].startswith("rerank-") and len(native["id"]) == len("rerank-") + 32
    # the over-long document cut at its end, as the offline Scorer cuts it when asked
    want = Scorer(folder, device="cpu", dtype="float32").score(QUERY, DOCS, truncate="end")
    _, whole = post(url, "/v1/rerank", {"query": QUERY, "documents": DOCS})
    got = sorted(whole["results"], key=lambda r: r["index"])
    np.testing.assert_allclose([r["relevance_score"] for r in got], want, atol=1e-5)


@pytest.mark.parametrize(
    "extra",
    [{}, {"raw_scores": True, "return_text": True}, {"truncate": True}],
    ids=["sigmoid", "raw", "cut"],
)
def test_teis_rerank_answers_as_the_python_front(
    reranker: tuple[str, Path], extra: dict[str, Any]
) -> None:
    url, _ = reranker
    docs = DOCS if extra.get("truncate") else TEXTS
    status, native = post(url, "/rerank", {"query": QUERY, "texts": docs, **extra})
    status_py, python = post(url, "/rerank", {"query": QUERY, "texts": _objects(docs), **extra})
    assert status == status_py == 200, (native, python)
    _same(native, python, "score")


def test_cohere_v2_rerank_answers_as_the_python_front(reranker: tuple[str, Path]) -> None:
    url, _ = reranker
    body = {"model": "rr", "query": QUERY, "top_n": 2}
    status, native = post(url, "/v2/rerank", {**body, "documents": DOCS})
    status_py, python = post(url, "/v2/rerank", {**body, "documents": _objects(DOCS)})
    assert status == status_py == 200, (native, python)
    _same(native["results"], python["results"], "relevance_score")
    assert native["meta"] == python["meta"] and len(native["id"]) == len(python["id"]) == 36


def test_v1_score_answers_as_the_python_front(reranker: tuple[str, Path]) -> None:
    url, _ = reranker
    status, native = post(url, "/v1/score", {"model": "rr", "text_1": QUERY, "text_2": TEXTS})
    status_py, python = post(url, "/v1/score", {"text_1": [QUERY], "text_2": TEXTS})
    assert status == status_py == 200, (native, python)
    _same(native["data"], python["data"], "score")
    assert native["usage"] == python["usage"] and isinstance(native["created"], int)


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/v1/rerank", {"query": QUERY, "documents": ["a", " \t"]}, "documents[1]"),
        ("/v1/rerank", {"query": "\u001c", "documents": ["a"]}, "query"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
        ("/v1/rerank", {"query": "word " * 600, "documents": ["a"]}, "query"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a"], "model": "other"}, "not served"),
        ("/rerank", {"query": QUERY, "texts": [LONG]}, "texts[0]"),
        ("/v1/score", {"text_1": QUERY, "text_2": [LONG]}, "text_2[0]"),
        ("/v1/score", {"text_1": QUERY, "text_2": ["a"], "truncate": True}, "truncate"),
    ],
)
def test_what_the_python_front_refuses_is_refused(
    reranker: tuple[str, Path], path: str, body: dict[str, Any], words: str
) -> None:
    url, _ = reranker
    status, reply = post(url, path, body)
    assert status in (400, 404), reply
    assert words in reply["error"]["message"], reply


def test_metrics_count_the_native_scores(reranker: tuple[str, Path]) -> None:
    """Ivy's answers on the scoring routes reach `/metrics` in the Python front's series."""
    url, _ = reranker

    def count(route: str) -> float:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as reply:
            text = reply.read().decode()
        found = re.search(
            rf'^embedserve_gateway_request_seconds_count\{{route="{re.escape(route)}"\}} (\S+)',
            text,
            re.M,
        )
        return float(found.group(1)) if found else 0.0

    for route, body in (
        ("/v1/score", {"text_1": QUERY, "text_2": TEXTS}),
        ("/v2/rerank", {"query": QUERY, "documents": TEXTS}),
    ):
        before = count(route)
        for _ in range(2):
            assert post(url, route, body)[0] == 200
        assert count(route) - before >= 2, route
