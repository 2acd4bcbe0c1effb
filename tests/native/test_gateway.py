"""The native prototype gateway (`embedserve._native.Gateway`: hyper, serde, the native
tokenizer, Tulip's queue) in front of the real CPU engine's `step()`: the vectors of
`Embedder.encode` for the same texts, a text alone as in a batch, clear errors in OpenAI's shape,
bounds before the work, concurrent clients each answered with their own rows, and `stop()`."""

from __future__ import annotations

import http.client
import json
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve._native import Gateway
from embedserve.embedder import Embedder
from embedserve.engine.fidelity import row_cosines

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from harness.native_front import gateway_for

TEXTS = ["what is the capital of france", "Café déjà vu — naïve", "ok", "word " * 60]


@pytest.fixture(scope="module")
def embedder(minilm_path: Path) -> Embedder:
    return Embedder(minilm_path, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def gateway(embedder: Embedder, minilm_path: Path) -> Iterator[Gateway]:
    gw = gateway_for(embedder.engine, minilm_path, max_body_bytes=4096, max_inputs=8)
    serving = threading.Thread(target=gw.serve, daemon=True)
    serving.start()
    yield gw
    gw.stop()
    serving.join(5)
    assert not serving.is_alive()


def post(port: int, body: Any, path: str = "/v1/embeddings") -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, raw, {"Content-Type": "application/json"})
    reply = conn.getresponse()
    out = reply.status, json.loads(reply.read())
    conn.close()
    return out


def vectors(answer: dict[str, Any]) -> np.ndarray:
    return np.array([d["embedding"] for d in answer["data"]], dtype=np.float32)


def test_the_vectors_are_the_embedders(gateway: Gateway, embedder: Embedder) -> None:
    status, answer = post(gateway.port, {"input": TEXTS, "model": "minilm"})
    assert status == 200 and [d["index"] for d in answer["data"]] == [0, 1, 2, 3]
    expected = embedder.encode(TEXTS)
    assert row_cosines(vectors(answer), expected).min() >= 0.99999
    assert answer["usage"]["prompt_tokens"] == sum(
        len(ids) for ids in embedder.inputs.tokenizer.encode(TEXTS)
    )
    alone = np.concatenate([vectors(post(gateway.port, {"input": t})[1]) for t in TEXTS])
    np.testing.assert_allclose(alone, vectors(answer), atol=1e-5)


def test_base64_answers_the_same_floats(gateway: Gateway) -> None:
    import base64

    _, floats = post(gateway.port, {"input": ["a b c"]})
    _, b64 = post(gateway.port, {"input": ["a b c"], "encoding_format": "base64"})
    raw = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(raw, vectors(floats)[0], rtol=1e-6)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_body"),
        ({"input": 3}, 400, "invalid_body"),
        ({"input": []}, 400, "empty_input"),
        ({"input": ["a", ""]}, 400, "empty_text"),
        ({"input": ["a"] * 9}, 400, "too_many_inputs"),
        ({"input": "word " * 600}, 400, "input_too_long"),
        ({"input": "x" * 5000}, 413, "body_too_large"),
    ],
)
def test_bad_requests_say_what_and_where(
    gateway: Gateway, body: Any, status: int, code: str
) -> None:
    got, answer = post(gateway.port, body)
    assert (got, answer["error"]["code"]) == (status, code), answer
    assert answer["error"]["message"]


def test_an_unknown_route_is_a_404(gateway: Gateway) -> None:
    status, answer = post(gateway.port, {"input": "a"}, "/v2/nothing")
    assert status == 404 and answer["error"]["code"] == "not_found"


def test_concurrent_clients_each_get_their_own_rows(gateway: Gateway, embedder: Embedder) -> None:
    texts = [f"query number {i} about topic {i % 7}" for i in range(48)]
    expected = embedder.encode(texts)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda t: post(gateway.port, {"input": t}), texts))
    assert all(status == 200 for status, _ in answers)
    got = np.concatenate([vectors(a) for _, a in answers])
    assert row_cosines(got, expected).min() >= 0.99999


def test_a_large_request_is_cut_into_parts_and_answered_in_order(
    embedder: Embedder, minilm_path: Path
) -> None:
    """Parts of at most `batch_tokens` (a text over it alone in its part), queued at once and
    re-assembled in order: the same vectors as one batch."""
    small = gateway_for(embedder.engine, minilm_path, batch_tokens=32)
    serving = threading.Thread(target=small.serve, daemon=True)
    serving.start()
    try:
        texts = [*TEXTS, *(f"text {i} " * (1 + i % 5) for i in range(20))]
        status, answer = post(small.port, {"input": texts})
        assert status == 200 and [d["index"] for d in answer["data"]] == list(range(len(texts)))
        assert row_cosines(vectors(answer), embedder.encode(texts)).min() >= 0.99999
    finally:
        small.stop()
        serving.join(5)
