"""TEI's gRPC API of a real `embedserve serve --tei-grpc-port 0` (and `serve --native`'s, for the
embedding model), called by tei-client's `GrpcClient` (and its generated stubs for what the
client does not send), unchanged but for the address: vectors equal the OpenAI route's (cosine
>= 0.99999), scores `/rerank`'s and `/v1/rerank`'s, token ids `/tokenize`'s; errors are gRPC
codes with the HTTP routes' messages."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from tests.e2e.conftest import Proc
from tests.e2e.test_dropin_clients import QUERY, TEXTS, cosine, openai_vectors
from tests.e2e.test_rerank_serving import post

grpc = pytest.importorskip("grpc")
tei_client = pytest.importorskip("tei_client")
from tei_client.stubs import tei_pb2, tei_pb2_grpc  # noqa: E402

pytestmark = pytest.mark.slow
KEY = "grpc-test-key"


def start(*args: str) -> tuple[Proc, str, str]:
    # float32: the vectors of the two transports' batches are compared at 0.99999 (bf16 GEMMs
    # on the CPU round differently with the batch's row count)
    proc = Proc(
        "serve",
        "--port",
        "0",
        "--tei-grpc-port",
        "0",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        *args,
    )
    url = proc.wait_for(r"embedserve: serving \S+ at (\S+)").group(1)
    address = proc.wait_for(r"embedserve: TEI's gRPC API at (\S+)").group(1)
    return proc, url, address


@pytest.fixture(autouse=True)
def current_event_loop() -> Iterator[None]:
    """tei_client's GrpcClient makes a grpc.aio channel when constructed, which takes the main
    thread's current event loop: a fresh script has one, but after another test's asyncio.run()
    the main thread has none (asyncio.run leaves it unset)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield
    asyncio.set_event_loop(None)
    loop.close()


@pytest.fixture(scope="module", params=["python", "native"])
def minilm(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    # python: both workers serve the one gRPC port; native: the Python front's loop serves it
    flags = ("--no-native", "--workers", "2") if request.param == "python" else ("--native",)
    proc, url, address = start(*flags)
    try:
        yield url, address
    finally:
        proc.stop()


def test_embed_info_and_streams_through_tei_client(minilm: tuple[str, str]) -> None:
    url, address = minilm
    client = tei_client.GrpcClient(address)
    info = client.info()
    assert (
        info.server_model_id == "minilm"
        and info.server_model_type == tei_client.ModelType.Embedding
    )
    assert info.max_input_length == 256 and info.max_client_batch_size == 2048
    got = np.array(client.embed(TEXTS))  # EmbedStream, one request per text
    want = openai_vectors(url, TEXTS)
    assert got.shape == want.shape and cosine(got, want).min() >= 0.99999
    # a longer stream than the window of requests in flight, answered in order
    many = [f"text number {i}" for i in range(150)]
    assert cosine(np.array(client.embed(many)), openai_vectors(url, many)).min() >= 0.99999
    states = client.embed_all(TEXTS[:2])  # EmbedAllStream: every token's final hidden state
    pooled = openai_vectors(url, TEXTS[:2], normalize=False)
    for rows, vector in zip(states, pooled, strict=True):
        np.testing.assert_allclose(np.array(rows).mean(axis=0), vector, atol=1e-4)


def test_unary_embed_options_match_http(minilm: tuple[str, str]) -> None:
    url, address = minilm
    stub = tei_pb2_grpc.EmbedStub(grpc.insecure_channel(address))
    one = stub.Embed(tei_pb2.EmbedRequest(inputs=TEXTS[1]))
    assert cosine(one.embeddings, openai_vectors(url, TEXTS[1:2])[0]) >= 0.99999
    assert one.metadata.compute_tokens > 0 and one.metadata.compute_chars == len(TEXTS[1])
    long_text = "word " * 1000
    cut = stub.Embed(tei_pb2.EmbedRequest(inputs=long_text, truncate=True, truncation_direction=1))
    want = openai_vectors(url, [long_text], truncate="start")[0]
    assert cosine(cut.embeddings, want) >= 0.99999


def test_tokenize_and_decode_agree_with_http(minilm: tuple[str, str]) -> None:
    url, address = minilm
    client = tei_client.GrpcClient(address)
    ids = post(url, "/tokenize", {"input": TEXTS[:2]})[1]["tokens"]
    results = client.tokenize(TEXTS[:2])
    assert [r.get_ids() for r in results] == ids
    first = results[0].tokens
    assert first[0].text == "[CLS]" and first[0].special
    assert [t.text for t in first[1:3]] == [
        "What",
        "is",
    ]  # the input's own characters (the ids are lowercased)
    assert (first[1].start, first[1].stop) == (0, 4)
    plain = client.tokenize(TEXTS[0], add_special_tokens=False)[0].get_ids()
    assert plain == ids[0][1:-1]
    assert client.decode(ids[0]) == post(url, "/decode", {"ids": ids[0]})[1][0]
    assert client.decode(ids, skip_special_tokens=False)[1].startswith("[CLS] paris")


def test_rerank_by_cosine_equals_tei_rerank(minilm: tuple[str, str]) -> None:
    url, address = minilm
    stub = tei_pb2_grpc.RerankStub(grpc.insecure_channel(address))
    got = stub.Rerank(tei_pb2.RerankRequest(query=QUERY, texts=TEXTS, return_text=True))
    status, want = post(url, "/rerank", {"query": QUERY, "texts": TEXTS, "return_text": True})
    assert status == 200
    assert [(r.index, r.text) for r in got.ranks] == [(r["index"], r["text"]) for r in want]
    assert [r.score for r in got.ranks] == pytest.approx([r["score"] for r in want], abs=1e-6)


def test_errors_are_grpc_codes_with_the_routes_messages(minilm: tuple[str, str]) -> None:
    channel = grpc.insecure_channel(minilm[1])
    embed = tei_pb2_grpc.EmbedStub(channel)
    cases = [
        (lambda: embed.Embed(tei_pb2.EmbedRequest(inputs="")), "INVALID_ARGUMENT", "empty string"),
        (
            lambda: embed.Embed(tei_pb2.EmbedRequest(inputs="word " * 1000)),
            "INVALID_ARGUMENT",
            "256",
        ),
        (
            lambda: embed.Embed(tei_pb2.EmbedRequest(inputs="x", prompt_name="nope")),
            "INVALID_ARGUMENT",
            "prompt_name",
        ),
        (
            lambda: embed.EmbedSparse(tei_pb2.EmbedSparseRequest(inputs="x")),
            "INVALID_ARGUMENT",
            "sparse",
        ),
        (
            lambda: tei_pb2_grpc.PredictStub(channel).Predict(tei_pb2.PredictRequest(inputs="x")),
            "FAILED_PRECONDITION",
            "classifier",
        ),
        (
            lambda: tei_pb2_grpc.TokenizeStub(channel).Decode(tei_pb2.DecodeRequest(ids=[10**7])),
            "INVALID_ARGUMENT",
            "vocabulary",
        ),
    ]
    for call, code, words in cases:
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code().name == code, caught.value.details()
        assert words in caught.value.details()
    # an error inside a stream ends it with that error
    with pytest.raises(grpc.RpcError) as caught:
        list(
            embed.EmbedStream(
                iter([tei_pb2.EmbedRequest(inputs="ok"), tei_pb2.EmbedRequest(inputs="")])
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    folder: Path = make_checkpoint(
        tmp_path_factory.mktemp("ms-marco-grpc"), arch="ms-marco-minilm-l6", dtype="float32",
        seed=5, overwrite=True,
    )  # fmt: skip
    proc, url, address = start("--model", str(folder), "--api-key", KEY)
    try:
        yield url, address
    finally:
        proc.stop()


def test_a_cross_encoder_reranks_as_v1_rerank_with_the_api_key(reranker: tuple[str, str]) -> None:
    url, address = reranker
    auth = (("authorization", f"Bearer {KEY}"),)
    stub = tei_pb2_grpc.RerankStub(grpc.insecure_channel(address))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Rerank(tei_pb2.RerankRequest(query=QUERY, texts=TEXTS))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "API key" in caught.value.details()
    raw = stub.Rerank(
        tei_pb2.RerankRequest(query=QUERY, texts=TEXTS, raw_scores=True), metadata=auth
    )
    want = v1_scores_with_key(url)  # ms-marco's Identity activation: /v1/rerank gives the logits
    assert {r.index: r.score for r in raw.ranks} == pytest.approx(want, abs=1e-5)
    streamed = stub.RerankStream(
        iter([tei_pb2.RerankStreamRequest(query=QUERY, text=t, raw_scores=True) for t in TEXTS]),
        metadata=auth,
    )
    assert {r.index: r.score for r in streamed.ranks} == pytest.approx(want, abs=1e-5)
    info = tei_pb2_grpc.InfoStub(grpc.insecure_channel(address)).Info(
        tei_pb2.InfoRequest(), metadata=auth
    )
    assert info.model_type == tei_pb2.MODEL_TYPE_RERANKER


def v1_scores_with_key(url: str) -> dict[int, float]:
    request = urllib.request.Request(
        f"{url}/v1/rerank",
        json.dumps({"query": QUERY, "documents": TEXTS}).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        results = json.loads(reply.read())["results"]
    return {r["index"]: r["relevance_score"] for r in results}


def test_embed_sparse_equals_the_http_route(tmp_path: Path) -> None:
    """EmbedSparse on a SPLADE folder answers what `/embed_sparse` answers, entry for entry."""
    folder = make_checkpoint(tmp_path / "splade", arch="splade-minilm-l6", dtype="float32", seed=5)
    proc, url, address = start("--model", str(folder), "--workers", "1")
    try:
        embed = tei_pb2_grpc.EmbedStub(grpc.insecure_channel(address))
        for text in TEXTS[:3]:
            got = embed.EmbedSparse(tei_pb2.EmbedSparseRequest(inputs=text))
            status, want = post(url, "/embed_sparse", {"inputs": text})
            assert status == 200
            assert [e.index for e in got.sparse_embeddings] == [e["index"] for e in want[0]]
            assert [e.value for e in got.sparse_embeddings] == pytest.approx(
                [e["value"] for e in want[0]], rel=1e-6
            )
            assert got.metadata.compute_tokens > 0
    finally:
        proc.stop()
