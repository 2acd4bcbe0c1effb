"""The peers' own Python clients, unchanged but for the base URL, against a real `embedserve
serve`: `huggingface_hub.InferenceClient` (TEI's `POST /`), `tei_client.HttpClient` (TEI's
routes), `cohere.ClientV2` (`/v2/embed`, `/v2/rerank`). Their vectors equal the OpenAI route's
and their scores `/v1/rerank`'s."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from tests.e2e.conftest import Proc
from tests.e2e.test_rerank_serving import post

cohere = pytest.importorskip("cohere")
tei_client = pytest.importorskip("tei_client")
hub = pytest.importorskip("huggingface_hub")

pytestmark = pytest.mark.slow

TEXTS = [
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "The quick brown fox jumps over the lazy dog.",
    "東京は日本の首都です。",
]
QUERY = "where is Paris?"


def cosine(a: Any, b: Any) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def openai_vectors(url: str, texts: list[str], **extra: Any) -> np.ndarray:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    response = client.embeddings.create(
        model="minilm", input=texts, encoding_format="float", extra_body=extra or None
    )
    return np.array([d.embedding for d in response.data])


def v1_scores(url: str, query: str, docs: list[str]) -> dict[int, float]:
    status, reply = post(url, "/v1/rerank", {"query": query, "documents": docs})
    assert status == 200, reply
    return {r["index"]: r["relevance_score"] for r in reply["results"]}


def test_inference_client_feature_extraction_posts_to_the_root(each_served: str) -> None:
    client = hub.InferenceClient(model=each_served)
    got = client.feature_extraction(TEXTS)
    want = openai_vectors(each_served, TEXTS)
    assert got.shape == want.shape == (len(TEXTS), 384)
    assert cosine(got, want).min() >= 0.99999
    one = client.feature_extraction(TEXTS[0])
    assert one.shape == (1, 384) and cosine(one[0], want[0]) >= 0.99999
    raw = client.feature_extraction(TEXTS[:2], normalize=False)
    np.testing.assert_allclose(
        raw, openai_vectors(each_served, TEXTS[:2], normalize=False), atol=1e-5
    )
    long_text = "word " * 1000
    cut = client.feature_extraction(long_text, truncate=True, truncation_direction="right")
    assert cosine(cut[0], openai_vectors(each_served, [long_text], truncate="end")[0]) >= 0.99999


def test_inference_client_sentence_similarity(each_served: str) -> None:
    got = hub.InferenceClient(model=each_served).sentence_similarity(TEXTS[0], TEXTS[1:])
    vectors = openai_vectors(each_served, TEXTS)
    assert got == pytest.approx(cosine(vectors[:1], vectors[1:]).tolist(), abs=1e-5)


def test_tei_client_embed_embed_all_decode_info(each_served: str) -> None:
    client = tei_client.HttpClient(each_served)
    info = client.info()
    assert info.server_model_id == "minilm"
    assert info.server_model_type == tei_client.ModelType.Embedding
    assert info.max_input_length == 256 and info.max_client_batch_size == 2048
    got = np.array(client.embed(TEXTS))
    assert cosine(got, openai_vectors(each_served, TEXTS)).min() >= 0.99999
    # every token's final hidden state: their mean is the (un-normalized) mean-pooled vector
    states = client.embed_all(TEXTS[:2])
    pooled = openai_vectors(each_served, TEXTS[:2], normalize=False)
    ids = post(each_served, "/tokenize", {"input": TEXTS[:2]})[1]["tokens"]
    for rows, vector, seq in zip(states, pooled, ids, strict=True):
        rows = np.array(rows)
        assert rows.shape == (len(seq), 384)
        np.testing.assert_allclose(rows.mean(axis=0), vector, atol=1e-4)
    assert client.decode(ids[0]) == [TEXTS[0].lower()]  # the uncased tokenizer's text
    assert client.decode(ids, skip_special_tokens=False)[1].startswith("[CLS] paris")


def test_tei_routes_answer_tei_errors(each_served: str) -> None:
    status, reply = post(each_served, "/embed", {"inputs": ""})
    assert status == 400 and reply["error_type"] == "validation"
    assert "empty string" in reply["error"]
    status, reply = post(each_served, "/embed", {"inputs": "x", "dimension": 8})
    assert status == 400 and "dimension" in reply["error"]
    status, reply = post(each_served, "/decode", {"ids": [10**7]})
    assert status == 400 and "vocabulary" in reply["error"]


def test_cohere_client_embed_by_types(each_served: str) -> None:
    client = cohere.ClientV2(base_url=each_served, api_key="x", max_retries=0)
    response = client.embed(
        model="minilm",
        texts=TEXTS,
        input_type="search_document",
        embedding_types=["float", "int8", "ubinary", "base64"],
    )
    want = openai_vectors(each_served, TEXTS)
    got = np.array(response.embeddings.float_)
    assert cosine(got, want).min() >= 0.99999
    np.testing.assert_array_equal(
        response.embeddings.int8, openai_vectors(each_served, TEXTS, output_dtype="int8")
    )
    np.testing.assert_array_equal(
        response.embeddings.ubinary, openai_vectors(each_served, TEXTS, output_dtype="ubinary")
    )
    decoded = [np.frombuffer(base64.b64decode(b), "<f4") for b in response.embeddings.base64]
    np.testing.assert_array_equal(np.stack(decoded), got.astype(np.float32))
    assert response.texts == TEXTS and response.meta.billed_units.input_tokens > 0
    short = client.embed(
        model="minilm", texts=TEXTS[:1], input_type="search_query", output_dimension=64
    )
    want64 = openai_vectors(each_served, TEXTS[:1], dimensions=64)
    assert cosine(np.array(short.embeddings.float_), want64).min() >= 0.99999
    with pytest.raises(cohere.errors.BadRequestError):
        client.embed(model="minilm", texts=["x"], input_type="image")


def test_cohere_client_rerank_scores_equal_v1_rerank(each_served: str) -> None:
    client = cohere.ClientV2(base_url=each_served, api_key="x", max_retries=0)
    response = client.rerank(model="minilm", query=QUERY, documents=TEXTS, top_n=3)
    want = v1_scores(each_served, QUERY, TEXTS)
    assert [r.index for r in response.results] == sorted(want, key=lambda i: -want[i])[:3]
    for r in response.results:
        assert r.relevance_score == pytest.approx(want[r.index], abs=1e-6)


@pytest.fixture(scope="module", params=["python", "native"])
def reranker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A cross-encoder under `serve`, then `serve --native` (Ivy answers its plain scoring
    bodies: the clients' own requests)."""
    folder: Path = make_checkpoint(
        tmp_path_factory.mktemp("ms-marco-dropin"),
        arch="ms-marco-minilm-l6",
        dtype="float32",
        seed=5,
        overwrite=True,
    )
    native = ["--native"] if request.param == "native" else ["--no-native"]
    proc = Proc("serve", *native, "--model", str(folder), "--port", "0", "--device", "cpu",
                "--served-model-name", "ms-marco")  # fmt: skip
    try:
        yield proc.wait_for(r"embedserve: serving \S+ at (\S+)").group(1)
    finally:
        proc.stop()


def test_a_reranker_through_tei_client_cohere_and_the_root(reranker: str) -> None:
    want = v1_scores(reranker, QUERY, TEXTS)  # ms-marco's Identity activation: the logits
    client = tei_client.HttpClient(reranker)
    assert client.info().server_model_type == tei_client.ModelType.Reranker
    ranks = client.rerank(QUERY, TEXTS, raw_scores=True).ranks
    assert {r.index: r.score for r in ranks} == pytest.approx(want, abs=1e-5)
    co = cohere.ClientV2(base_url=reranker, api_key="x", max_retries=0)
    results = co.rerank(model="ms-marco", query=QUERY, documents=TEXTS).results
    assert {r.index: r.relevance_score for r in results} == pytest.approx(want, abs=1e-5)
    # TEI's POST / for a reranker: /rerank's body and answer
    status, reply = post(reranker, "/", {"query": QUERY, "texts": TEXTS, "raw_scores": True})
    assert status == 200 and {r["index"]: r["score"] for r in reply} == pytest.approx(want)
    # a route of another task: a 400 naming what this model does
    status, reply = post(reranker, "/embed", {"inputs": "x"})
    assert status == 400 and "is a reranker" in reply["error"] and "/rerank" in reply["error"]
    with pytest.raises(cohere.errors.BadRequestError, match="reranker"):
        co.embed(model="ms-marco", texts=["x"], input_type="search_query")


@pytest.mark.parametrize("name", ["huggingface_hub", "tei_client", "cohere"])
def test_the_clients_doc_snippets_run_as_written(each_served: str, name: str) -> None:
    text = (Path(__file__).parents[2] / "docs" / "clients.md").read_text(encoding="utf-8")
    blocks = dict(re.findall(r"<!-- tested-root: (\w+) -->\n```python\n(.*?)```", text, re.S))
    exec(compile(blocks[name], f"clients.md:{name}", "exec"), {"SERVER_URL": each_served})
