"""POST /v1/contextualizedembeddings against `embedserve serve` (minilm): each chunk vector
equals `Embedder.encode_contextual`, and bad input gets documented OpenAI-shaped 400s."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from tests.e2e.test_replica_failure import call

pytestmark = pytest.mark.slow

ROUTE = "/v1/contextualizedembeddings"
DOCUMENTS = [
    ["The Eiffel Tower is in Paris.", "It is 330 metres tall.", "Millions of people visit it."],
    ["A document of one chunk."],
    ["Der Fuchs springt.", "東京は日本の首都です。", "emoji 🙂🚀 and\ttabs"],
]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def chunk_rows(reply: dict[str, Any], decode: Any = np.asarray) -> list[np.ndarray]:
    assert reply["object"] == "list"
    assert [d["index"] for d in reply["data"]] == list(range(len(reply["data"])))
    out = []
    for document in reply["data"]:
        assert document["object"] == "list"
        assert [c["index"] for c in document["data"]] == list(range(len(document["data"])))
        assert {c["object"] for c in document["data"]} == {"embedding"}
        out.append(np.stack([decode(c["embedding"]) for c in document["data"]]))
    return out


def test_chunk_vectors_equal_encode_contextual(served: str, minilm: Any) -> None:
    status, reply = call(served, "POST", ROUTE, {"model": "minilm", "input": DOCUMENTS})
    assert status == 200, reply
    want = minilm.encode_contextual(DOCUMENTS)
    got = chunk_rows(reply)
    for g, w, chunks in zip(got, want, DOCUMENTS, strict=True):
        assert g.shape == w.shape == (len(chunks), 384)
        assert cosine(g, w).min() >= 0.99999
    assert reply["model"] == "minilm"
    num_tokens = sum(len(ids) for ids in minilm.tokenize([" ".join(d) for d in DOCUMENTS]))
    assert reply["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
    # context matters: a chunk embedded alone is a different vector
    alone = minilm.encode(DOCUMENTS[0][1])
    assert cosine(got[0][1], alone) < 0.999


def test_options_dimensions_base64_normalize(served: str, minilm: Any) -> None:
    body = {"input": DOCUMENTS[:1], "dimensions": 128, "encoding_format": "base64"}
    status, reply = call(served, "POST", ROUTE, {**body, "normalize": False})
    assert status == 200, reply
    [got] = chunk_rows(reply, lambda s: np.frombuffer(base64.b64decode(s), "<f4"))
    [want] = minilm.encode_contextual(DOCUMENTS[:1], dimensions=128, normalize=False)
    assert got.shape == (3, 128)
    assert cosine(got, want).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1), rtol=1e-4)
    status, reply = call(
        served,
        "POST",
        ROUTE,
        {**body, "output_dtype": "ubinary", "encoding_format": "base64_packed"},
    )
    assert status == 200, reply
    [bits] = chunk_rows(reply, lambda s: np.frombuffer(base64.b64decode(s), "u1"))
    [want_bits] = minilm.encode_contextual(DOCUMENTS[:1], dimensions=128, output_dtype="ubinary")
    assert bits.shape == want_bits.shape == (3, 16)
    # sign bits of the same floats: equal but for a coordinate within rounding of zero
    differing = np.unpackbits(bits ^ want_bits).sum()
    assert differing <= 1


# (name, body, status, error code)
BATTERY: list[tuple[str, Any, int, str]] = [
    ("missing input", {"model": "minilm"}, 400, "missing_required_parameter"),
    ("input a string", {"input": "a document"}, 400, "invalid_type"),
    ("empty document list", {"input": []}, 400, "invalid_value"),
    ("document a string", {"input": ["a document"]}, 400, "invalid_type"),
    ("document with no chunks", {"input": [["a"], []]}, 400, "invalid_value"),
    ("empty chunk", {"input": [["a", ""]]}, 400, "invalid_value"),
    ("blank chunk", {"input": [["a", "  \n\t"]]}, 400, "invalid_value"),
    ("chunk not a string", {"input": [["a", None]]}, 400, "invalid_type"),
    ("too many chunks", {"input": [["c"] * 1025]}, 400, "too_many_chunks"),
    ("too many documents", {"input": [["c"]] * 2049}, 400, "too_many_inputs"),
    (
        "document over the limit",
        {"input": [["word " * 150, "word " * 150]]},
        400,
        "context_length_exceeded",
    ),
    ("dimensions 0", {"input": [["a"]], "dimensions": 0}, 400, "invalid_value"),
    ("dimensions over hidden", {"input": [["a"]], "dimensions": 385}, 400, "invalid_value"),
    ("dimensions a string", {"input": [["a"]], "dimensions": "8"}, 400, "invalid_type"),
    (
        "binary, dimensions not /8",
        {"input": [["a"]], "dimensions": 12, "output_dtype": "binary"},
        400,
        "invalid_value",
    ),
    ("bad output_dtype", {"input": [["a"]], "output_dtype": "int4"}, 400, "invalid_value"),
    ("unknown field", {"input": [["a"]], "truncate": "end"}, 400, "unknown_parameter"),
    ("unknown model", {"input": [["a"]], "model": "gpt"}, 404, "model_not_found"),
    ("not an object", [["a"]], 400, "invalid_type"),
]


@pytest.mark.parametrize(("name", "body", "status", "code"), BATTERY, ids=[b[0] for b in BATTERY])
def test_bad_input_gets_a_clear_openai_shaped_error(
    served: str, name: str, body: Any, status: int, code: str
) -> None:
    got, reply = call(served, "POST", ROUTE, body)
    assert got == status, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert error["message"]


def test_still_correct_after_the_battery_and_on_openapi(served: str, minilm: Any) -> None:
    status, reply = call(served, "POST", ROUTE, {"input": DOCUMENTS[1:2]})
    assert status == 200, reply
    [got] = chunk_rows(reply)
    assert cosine(got, minilm.encode_contextual(DOCUMENTS[1:2])[0]).min() >= 0.99999
    status, spec = call(served, "GET", "/openapi.json")
    assert status == 200
    post = spec["paths"][ROUTE]["post"]
    schema = post["requestBody"]["content"]["application/json"]["schema"]
    assert schema["properties"]["input"]["items"]["maxItems"] == 1024
    assert set(post["responses"]) >= {"200", "400"}
