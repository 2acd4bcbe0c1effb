"""`embedserve serve --native` on the models whose requests all go through the Python front (a
reranker, a SPLADE and a ColBERT model; random weights in the published layouts): their answers
equal the offline `Scorer` / `Embedder.encode_outputs` on the same folder, through Tulip (pairs
with their segment ids in its batches; sparse and token-vector outputs as call jobs), and a
request the model cannot answer gets the same 400 as from `serve`."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.embedder import Embedder
from embedserve.scorer import Scorer
from tests.e2e.conftest import Proc
from tests.e2e.test_rerank_serving import post
from tests.e2e.test_retrieval_serving import QUERY, TEXTS

pytestmark = pytest.mark.slow

ARCHS = {"rr": "ms-marco-minilm-l6", "splade": "splade-minilm-l6",
         "colbert": "answerai-colbert-small-v1"}  # fmt: skip


@pytest.fixture(scope="module", params=list(ARCHS))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, Path]]:
    """(name, base URL, folder) of one model under `serve --native`."""
    name = request.param
    folder = make_checkpoint(
        tmp_path_factory.mktemp(name) / name, arch=ARCHS[name], dtype="float32", seed=5
    )
    # parts of at most 32 tokens: a request of several texts is answered in parts, in order
    proc = Proc("serve", "--native", "--model", f"{name}={folder}", "--port", "0",
                "--device", "cpu", "--dtype", "float32", "--part-tokens", "32")  # fmt: skip
    try:
        found = proc.wait_for(
            rf"embedserve: serving {name} at (\S+) \(native front: plain (.+) (answered|through)"
        )
        # Ivy answers a reranker's plain scores and a SPLADE model's sparse vectors itself
        natively = {"rr": "scores", "splade": "sparse vectors"}
        assert (found.group(3) == "answered") == (name in natively), found.group(0)
        url = found.group(1)
        yield name, url, folder
    finally:
        proc.stop()


def _data(url: str, **body: Any) -> list[dict[str, Any]]:
    status, reply = post(url, "/v1/embeddings", body)
    assert status == 200, reply
    return list(reply["data"])


def test_answers_equal_the_offline_ones(served: tuple[str, str, Path]) -> None:
    name, url, folder = served
    if name == "rr":
        want = Scorer(folder, device="cpu", dtype="float32").score(QUERY, TEXTS)
        status, reply = post(url, "/v1/rerank", {"model": name, "query": QUERY, "documents": TEXTS})
        assert status == 200, reply
        got = sorted(reply["results"], key=lambda r: r["index"])
        np.testing.assert_allclose([r["relevance_score"] for r in got], want, atol=1e-5)
        return
    offline = Embedder(folder, device="cpu", dtype="float32")
    if name == "splade":
        data = _data(url, model=name, input=TEXTS, outputs=["sparse"])
        want = offline.encode_outputs(TEXTS).sparse
        assert want is not None
        for got, w in zip([d["sparse"] for d in data], want, strict=True):
            assert got["indices"] == w["indices"] and len(got["indices"]) > 0
            np.testing.assert_allclose(got["values"], w["values"], rtol=1e-5, atol=1e-6)
        return
    for side in ("query", "document"):
        data = _data(url, model=name, input=TEXTS, outputs=["multivector"], input_type=side)
        vectors = offline.encode_outputs(TEXTS, input_type=side).multivector
        assert vectors is not None
        for got, w in zip([d["multivector"] for d in data], vectors, strict=True):
            assert np.asarray(got).shape == w.shape and w.shape[0] > 0
            np.testing.assert_allclose(np.asarray(got), w, atol=1e-5)
    want = Scorer(folder, device="cpu", dtype="float32").score(QUERY, TEXTS)
    status, reply = post(url, "/v1/rerank", {"model": name, "query": QUERY, "documents": TEXTS})
    assert status == 200, reply
    got = sorted(reply["results"], key=lambda r: r["index"])
    np.testing.assert_allclose([r["relevance_score"] for r in got], want, rtol=1e-5, atol=1e-5)


def test_teis_plain_embed_sparse_answers_as_the_python_front(
    served: tuple[str, str, Path],
) -> None:
    """A sparse model's plain `/embed_sparse` is answered by Ivy (its sequences run alone
    through the engine's sparse outputs); with `truncation_direction` the Python front answers
    the same request: the same entries."""
    name, url, _ = served
    if name != "splade":
        pytest.skip("a sparse model's route")
    status, native = post(url, "/embed_sparse", {"inputs": TEXTS})
    status_py, python = post(
        url, "/embed_sparse", {"inputs": TEXTS, "truncation_direction": "Right"}
    )
    assert status == status_py == 200, (native, python)
    assert len(native) == len(TEXTS) and all(native)
    for got, want in zip(native, python, strict=True):
        assert [e["index"] for e in got] == [e["index"] for e in want]
        np.testing.assert_allclose([e["value"] for e in got], [e["value"] for e in want], atol=1e-6)
    (one,) = post(url, "/embed_sparse", {"inputs": TEXTS[1]})[1]
    assert [e["index"] for e in one] == [e["index"] for e in native[1]]


def test_concurrent_rerankings_keep_their_scores(
    served: tuple[str, str, Path],
) -> None:
    """Pairs (with their segment ids) go into Tulip's batches beside other requests' pairs:
    each of 8 concurrent requests' scores equal the offline ones of its pairs alone."""
    name, url, folder = served
    if name != "rr":
        pytest.skip("a reranker's pairs")
    scorer = Scorer(folder, device="cpu", dtype="float32")
    queries = [f"{QUERY} {i}" for i in range(8)]
    want = [scorer.score(q, TEXTS[: 1 + i % 3]) for i, q in enumerate(queries)]

    def rerank(i: int) -> list[float]:
        body = {"model": name, "query": queries[i], "documents": TEXTS[: 1 + i % 3]}
        status, reply = post(url, "/v1/rerank", body)
        assert status == 200, reply
        return [r["relevance_score"] for r in sorted(reply["results"], key=lambda r: r["index"])]

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(rerank, range(8)))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_a_plain_embeddings_request_gets_the_servers_400(served: tuple[str, str, Path]) -> None:
    name, url, _ = served
    status, reply = post(url, "/v1/embeddings", {"model": name, "input": TEXTS[0]})
    assert status == 400, reply
    code = "wrong_model_task" if name == "rr" else "output_not_available"
    assert reply["error"]["code"] == code and reply["error"]["message"]
