"""Sparse and multi-vector outputs over HTTP, real processes: one `embedserve serve` of three
random-weight folders in the published layouts (SPLADE, bge-m3-tiny, a PyLate ColBERT), each
answer equal to the offline `Embedder.encode_outputs` / `Scorer` on the same folder; TEI's
`/embed_sparse` shape; the `openai` client unchanged on bge-m3's dense output; every new 400."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.embedder import Embedder
from embedserve.scorer import Scorer
from tests.e2e.conftest import Proc
from tests.e2e.test_rerank_serving import post

pytestmark = pytest.mark.slow

TEXTS = [
    "what is late interaction retrieval?",
    "SPLADE expands queries and documents over the vocabulary, with weights.",
    "Zürich, 東京 and São Paulo: cities (and punctuation!) in one line...",
]
QUERY = "sparse lexical weights for search"
ARCHS = {"splade": "splade-minilm-l6", "m3": "bge-m3-tiny", "colbert": "answerai-colbert-small-v1"}
# small enough that a request of ten 250-word documents is over it (ColBERT: 96 dims)
MAX_MULTIVECTOR_VALUES = 50_000


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("retrieval-serving")
    return {
        name: make_checkpoint(root / arch, arch=arch, dtype="float32", seed=5)
        for name, arch in ARCHS.items()
    }


@pytest.fixture(scope="module")
def url(folders: dict[str, Path]) -> Iterator[str]:
    models = [a for name, folder in folders.items() for a in ("--model", f"{name}={folder}")]
    proc = Proc("serve", *models, "--port", "0", "--device", "cpu", "--dtype", "float32",
                "--max-multivector-values", str(MAX_MULTIVECTOR_VALUES))  # fmt: skip
    try:
        yield proc.wait_for(r"embedserve: serving splade, m3, colbert at (\S+)").group(1)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def offline(folders: dict[str, Path]) -> dict[str, Embedder]:
    return {
        name: Embedder(folder, device="cpu", dtype="float32") for name, folder in folders.items()
    }


def _embed(url: str, **body: Any) -> list[dict[str, Any]]:
    status, reply = post(url, "/v1/embeddings", body)
    assert status == 200, reply
    assert [d["index"] for d in reply["data"]] == list(range(len(body["input"])))
    return list(reply["data"])


def _same_sparse(got: list[dict[str, Any]], want: list[Any]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g["indices"] == w["indices"] and len(g["indices"]) > 0
        np.testing.assert_allclose(g["values"], w["values"], rtol=1e-5, atol=1e-6)


def _same_vectors(got: list[Any], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert np.asarray(g).shape == w.shape and w.shape[0] > 0
        np.testing.assert_allclose(np.asarray(g), w, atol=1e-5)


def test_bge_m3s_three_outputs_equal_the_offline_ones(
    url: str, offline: dict[str, Embedder]
) -> None:
    data = _embed(url, model="m3", input=TEXTS, outputs=["dense", "sparse", "multivector"])
    want = offline["m3"].encode_outputs(TEXTS)
    assert want.dense is not None and want.sparse is not None and want.multivector is not None
    np.testing.assert_allclose([d["embedding"] for d in data], want.dense, atol=1e-5)
    _same_sparse([d["sparse"] for d in data], want.sparse)
    _same_vectors([d["multivector"] for d in data], want.multivector)
    # one output alone: only its field
    (only,) = _embed(url, model="m3", input=TEXTS[:1], outputs=["sparse"])
    assert set(only) == {"object", "index", "sparse"}


def test_splade_and_colbert_sides_equal_the_offline_ones(
    url: str, offline: dict[str, Embedder]
) -> None:
    data = _embed(url, model="splade", input=TEXTS, outputs=["sparse"])
    _same_sparse([d["sparse"] for d in data], offline["splade"].encode_outputs(TEXTS).sparse or [])
    colbert = offline["colbert"]
    for side in ("query", "document"):
        data = _embed(url, model="colbert", input=TEXTS, outputs=["multivector"], input_type=side)
        want = colbert.encode_outputs(TEXTS, input_type=side).multivector
        assert want is not None
        _same_vectors([d["multivector"] for d in data], want)
    # a query is expanded to the model's query length, a document keeps its own tokens
    assert {len(d["multivector"]) for d in _embed(url, model="colbert", input=TEXTS,
            outputs=["multivector"], input_type="query")} == {32}  # fmt: skip


def test_encoding_format_and_output_dtype_apply_to_token_vectors(
    url: str, offline: dict[str, Embedder]
) -> None:
    (item,) = _embed(url, model="colbert", input=TEXTS[:1], outputs=["multivector"],
                     encoding_format="base64_packed", output_dtype="float16")  # fmt: skip
    want = offline["colbert"].encode_outputs(TEXTS[:1]).multivector
    assert want is not None
    got = np.stack([np.frombuffer(base64.b64decode(v), "<f2") for v in item["multivector"]])
    np.testing.assert_allclose(got, want[0].astype(np.float16), atol=1e-3)
    (item,) = _embed(url, model="m3", input=TEXTS[:1], outputs=["multivector"], output_dtype="int8")
    rows = np.asarray(item["multivector"])
    assert rows.dtype.kind == "i" and np.abs(rows).max() <= 127


def test_embed_sparse_answers_teis_shape(url: str, offline: dict[str, Embedder]) -> None:
    status, reply = post(url, "/embed_sparse", {"model": "splade", "inputs": TEXTS[1],
                                                "truncate": True, "truncation_direction": "Right"})  # fmt: skip
    assert status == 200 and len(reply) == 1
    want = offline["splade"].encode_outputs([TEXTS[1]], truncate="end").sparse
    assert want is not None
    assert [e["index"] for e in reply[0]] == want[0]["indices"]
    np.testing.assert_allclose([e["value"] for e in reply[0]], want[0]["values"], rtol=1e-5)
    assert all(set(e) == {"index", "value"} for e in reply[0])
    # bge-m3's lexical weights on the same route
    status, reply = post(url, "/embed_sparse", {"model": "m3", "inputs": TEXTS})
    m3 = offline["m3"].encode_outputs(TEXTS, outputs=["sparse"]).sparse
    assert status == 200 and m3 is not None
    assert [[e["index"] for e in r] for r in reply] == [s["indices"] for s in m3]


def test_scoring_routes_score_by_maxsim_and_bge_m3s_weights(
    url: str, folders: dict[str, Path]
) -> None:
    colbert = Scorer(folders["colbert"], device="cpu", dtype="float32").score(QUERY, TEXTS)
    status, reply = post(
        url, "/v1/rerank", {"model": "colbert", "query": QUERY, "documents": TEXTS}
    )
    assert status == 200
    assert [r["index"] for r in reply["results"]] == list(np.argsort(-colbert, kind="stable"))
    got = {r["index"]: r["relevance_score"] for r in reply["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(TEXTS))], colbert, rtol=1e-5)
    m3 = Scorer(folders["m3"], device="cpu", dtype="float32")
    weights = [0.4, 0.2, 0.4]
    want = m3.score(QUERY, TEXTS, weights=weights)
    assert not np.allclose(want, m3.score(QUERY, TEXTS))  # the weights change the scores
    status, reply = post(url, "/v1/score", {"model": "m3", "text_1": QUERY, "text_2": TEXTS,
                                           "weights": weights})  # fmt: skip
    assert status == 200
    np.testing.assert_allclose([d["score"] for d in reply["data"]], want, rtol=1e-5)
    splade = Scorer(folders["splade"], device="cpu", dtype="float32").score(QUERY, TEXTS)
    status, reply = post(url, "/v1/score", {"model": "splade", "text_1": QUERY, "text_2": TEXTS})
    np.testing.assert_allclose([d["score"] for d in reply["data"]], splade, rtol=1e-5)


def test_the_openai_client_is_unchanged_on_a_dense_output(
    url: str, offline: dict[str, Embedder]
) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    response = client.embeddings.create(model="m3", input=TEXTS)
    got = np.array([d.embedding for d in response.data])
    np.testing.assert_allclose(got, offline["m3"].encode(TEXTS), atol=1e-5)
    assert response.model == "m3" and got.shape == (len(TEXTS), 64)


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/v1/embeddings", {"model": "colbert", "outputs": ["sparse"]}, "outputs",
         "no sparse output; its outputs are multivector"),
        ("/v1/embeddings", {"model": "splade"}, "outputs", "no dense output; its outputs are sparse"),
        ("/v1/embeddings", {"model": "m3", "outputs": ["colbert"]}, "outputs", "non-empty list"),
        ("/v1/embeddings", {"model": "m3", "outputs": ["sparse"], "truncate": "chunk"},
         "truncate", "dense outputs only"),
        ("/v1/embeddings", {"model": "m3", "outputs": ["multivector"], "output_dtype": "binary",
         "dimensions": 60}, "dimensions", "multiple of 8"),
        ("/v1/embeddings", {"model": "colbert", "outputs": ["multivector"], "input_type": "x"},
         "input_type", '"query" or "document"'),
        ("/v1/embeddings", {"outputs": ["sparse"]}, "model", "'model' is required, one of splade, m3"),
        ("/v1/rerank", {"model": "colbert", "query": QUERY, "weights": [1, 1, 1]}, "weights",
         "bge-m3's"),
        ("/v1/score", {"model": "m3", "text_1": QUERY, "weights": [1, -1, 1]}, "weights",
         "three numbers >= 0"),
        ("/v1/rerank", {"model": "m3", "query": QUERY, "instruction": "x"}, "instruction",
         "reranker's"),
    ],
)  # fmt: skip
def test_bad_requests_are_400s_that_say_what(
    url: str, path: str, body: dict[str, Any], param: str, words: str
) -> None:
    inputs = {"/v1/embeddings": {"input": TEXTS}, "/v1/rerank": {"documents": TEXTS},
              "/v1/score": {"text_2": TEXTS}}[path]  # fmt: skip
    status, reply = post(url, path, {**inputs, **body})
    assert status == 400, reply
    assert words in reply["error"]["message"] and reply["error"]["param"] == param


def test_an_answer_over_the_multivector_bound_is_refused_before_any_work(url: str) -> None:
    docs = [" ".join(["word"] * 250)] * 10  # about 2,520 vectors x 96 dims, over 50,000
    status, reply = post(url, "/v1/embeddings", {"model": "colbert", "input": docs,
                                                 "outputs": ["multivector"]})  # fmt: skip
    assert status == 400 and reply["error"]["code"] == "output_too_large"
    message = reply["error"]["message"]
    assert "x 96 dims" in message and f"limit of {MAX_MULTIVECTOR_VALUES}" in message
    # TEI's route answers TEI's error shape
    status, reply = post(url, "/embed_sparse", {"model": "colbert", "inputs": TEXTS})
    assert status == 400 and "no sparse output" in reply["error"]
    assert reply["error_type"] == "validation"
