"""The real `openai` client against `embedserve serve`: results equal the offline Embedder."""

from __future__ import annotations

import asyncio
import base64
import random
from typing import Any

import numpy as np
import openai
import pytest

pytestmark = pytest.mark.slow

TEXTS = [
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "The quick brown fox jumps over the lazy dog.",
    "embeddings",
    "A much longer passage about vector search: " + "dense retrieval ranks documents " * 20,
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "東京は日本の首都です。",
    "emoji 🙂🚀 and\ttabs\nand newlines",
]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.fixture(scope="module")
def client(each_served: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{each_served}/v1", api_key="unused", max_retries=0)


def vectors(response: Any) -> np.ndarray:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array([d.embedding for d in response.data])


def test_float_embeddings_equal_the_embedder(client: openai.OpenAI, minilm: Any) -> None:
    response = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    got = vectors(response)
    want = minilm.encode(TEXTS)
    assert got.shape == want.shape == (len(TEXTS), 384)
    assert cosine(got, want).min() >= 0.99999
    assert response.model == "minilm"
    assert response.usage.prompt_tokens == sum(len(ids) for ids in minilm.tokenize(TEXTS))
    assert response.usage.total_tokens == response.usage.prompt_tokens


def test_base64_decodes_to_the_same_floats(client: openai.OpenAI, minilm: Any) -> None:
    as_float = vectors(
        client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    )
    raw = client.with_raw_response.embeddings.create(
        model="minilm", input=TEXTS, encoding_format="base64"
    )
    rows = [
        np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
        for d in raw.http_response.json()["data"]
    ]
    decoded = np.stack(rows)
    np.testing.assert_array_equal(decoded, as_float.astype(np.float32))
    # the client's own default path (it asks for base64 and decodes it)
    default = vectors(client.embeddings.create(model="minilm", input=TEXTS))
    np.testing.assert_array_equal(default.astype(np.float32), decoded)
    assert cosine(decoded, minilm.encode(TEXTS)).min() >= 0.99999


def test_dimensions_truncate_then_normalize(client: openai.OpenAI, minilm: Any) -> None:
    response = client.embeddings.create(
        model="minilm", input=TEXTS[:3], dimensions=64, encoding_format="float"
    )
    got = vectors(response)
    want = minilm.encode(TEXTS[:3], dimensions=64)
    assert got.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert cosine(got, want).min() >= 0.99999


def test_single_string_and_token_id_inputs(client: openai.OpenAI, minilm: Any) -> None:
    one = vectors(client.embeddings.create(model="minilm", input=TEXTS[0], encoding_format="float"))
    assert one.shape == (1, 384)
    ids = minilm.tokenize(TEXTS[:2])
    by_ids = vectors(client.embeddings.create(model="minilm", input=ids, encoding_format="float"))
    by_one_list = vectors(
        client.embeddings.create(model="minilm", input=ids[0], encoding_format="float")
    )
    want = minilm.encode(TEXTS[:2])
    assert cosine(by_ids, want).min() >= 0.99999
    assert cosine(by_one_list[0], want[0]) >= 0.99999
    assert cosine(one[0], want[0]) >= 0.99999


def test_extensions_output_dtype_normalize_truncate(client: openai.OpenAI, minilm: Any) -> None:
    int8 = client.embeddings.create(
        model="minilm",
        input=TEXTS[:2],
        encoding_format="float",
        extra_body={"output_dtype": "int8"},
    )
    np.testing.assert_array_equal(vectors(int8), minilm.encode(TEXTS[:2], output_dtype="int8"))
    raw = client.embeddings.create(
        model="minilm", input=TEXTS[:2], encoding_format="float", extra_body={"normalize": False}
    )
    want = minilm.encode(TEXTS[:2], normalize=False)
    np.testing.assert_allclose(vectors(raw), want, rtol=1e-3, atol=1e-4)
    assert abs(np.linalg.norm(vectors(raw)[0]) - 1.0) > 0.01  # really not normalized
    long_text = "word " * 1000
    cut = client.embeddings.create(
        model="minilm", input=long_text, encoding_format="float", extra_body={"truncate": "end"}
    )
    assert cut.usage.prompt_tokens == 256  # the model's max_seq_length
    assert cosine(vectors(cut)[0], minilm.encode(long_text, truncate="end")) >= 0.99999
    query = client.embeddings.create(
        model="minilm",
        input="a question",
        encoding_format="float",
        extra_body={"input_type": "query"},
    )
    assert cosine(vectors(query)[0], minilm.encode("a question")) >= 0.99999  # minilm: no prompts


def test_200_concurrent_mixed_size_requests_come_back_correct_and_in_order(
    each_served: str, minilm: Any
) -> None:
    rng = random.Random(0)
    words = " ".join(TEXTS).split()
    requests = []
    for _ in range(200):
        n = rng.choice([1, 1, 1, 2, 4, 8])
        requests.append([" ".join(rng.choices(words, k=rng.randint(1, 24))) for _ in range(n)])
    unique = sorted({t for r in requests for t in r})
    reference = dict(zip(unique, minilm.encode(unique), strict=True))

    async def run_all() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=f"{each_served}/v1", api_key="unused", max_retries=0)
        async with client:
            return await asyncio.gather(
                *(
                    client.embeddings.create(model="minilm", input=r, encoding_format="float")
                    for r in requests
                )
            )

    responses = asyncio.run(run_all())
    for texts, response in zip(requests, responses, strict=True):
        got = vectors(response)
        want = np.stack([reference[t] for t in texts])
        assert cosine(got, want).min() >= 0.99999


def test_models_and_tokenize(each_served: str, client: openai.OpenAI, minilm: Any) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["minilm"]
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{each_served}/tokenize",
        data=json.dumps({"input": TEXTS[:2]}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},  # urllib's default (a form) is a 415
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        body = json.load(reply)
    assert body["tokens"] == minilm.tokenize(TEXTS[:2])
    assert body["num_tokens"] == [len(t) for t in body["tokens"]]


def test_health_ready_metrics_openapi(each_served: str, client: openai.OpenAI) -> None:
    import json
    import urllib.request

    def get(path: str) -> tuple[int, bytes, str]:
        with urllib.request.urlopen(f"{each_served}{path}", timeout=10) as reply:
            return reply.status, reply.read(), reply.headers["content-type"]

    client.embeddings.create(model="minilm", input="count me")
    assert json.loads(get("/health")[1]) == {"status": "ok"}
    ready = json.loads(get("/ready")[1])
    assert ready["status"] == "ready" and ready["replicas"][0]["healthy"] is True
    status, body, content_type = get("/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    text = body.decode()
    assert 'embedserve_gateway_requests_total{route="/v1/embeddings",status="200"}' in text
    assert "embedserve_gateway_prompt_tokens_total" in text
    doc = json.loads(get("/openapi.json")[1])
    assert doc["openapi"].startswith("3.")
    assert {"/v1/embeddings", "/v1/models", "/tokenize", "/health", "/ready", "/metrics"} <= set(
        doc["paths"]
    )


OUTPUT_DTYPES = ("float32", "float16", "int8", "uint8", "binary", "ubinary")


@pytest.mark.parametrize("dtype", OUTPUT_DTYPES)
def test_every_output_dtype_is_right_or_a_clear_400(
    client: openai.OpenAI, minilm: Any, dtype: str
) -> None:
    """The client's default path (it asks for base64 and decodes float32 from it) never gets
    wrong numbers: float32 decodes right, any other dtype is a 400 that says what to pass; with
    the encoding_format it names, the client returns the dtype's exact values."""
    want = minilm.encode(TEXTS, output_dtype=dtype)
    extra = {"output_dtype": dtype}
    if dtype == "float32":
        got = vectors(client.embeddings.create(model="minilm", input=TEXTS, extra_body=extra))
        np.testing.assert_array_equal(got.astype(np.float32), want)
    else:
        with pytest.raises(openai.BadRequestError) as err:
            client.embeddings.create(model="minilm", input=TEXTS, extra_body=extra)
        message = err.value.response.json()["error"]["message"]
        assert f"output_dtype '{dtype}'" in message and "encoding_format 'float'" in message
    named = client.embeddings.create(
        model="minilm", input=TEXTS, encoding_format="float", extra_body=extra
    )
    got = vectors(named)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.astype(want.dtype), want)
