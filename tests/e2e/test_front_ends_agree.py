"""One request core behind both front ends: the same values through `Embedder` and through HTTP
give the same token ids, the same vectors and the same error messages."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest

from embedserve.embedder import Embedder

pytestmark = pytest.mark.slow

LONG = " ".join(f"sentence {i} is about topic {i % 7} and nothing else." for i in range(60))
TEXTS = ["what is a vector database", "Paris is the capital of France."]
IDS = [[101, 7592, 2088, 102], [101, 2054, 2003, 1037, 3231, 102]]

# (name, `input`, options): the HTTP body is {"input": ..., **options}; `Embedder.encode` takes
# the same names as keyword arguments
GOOD: list[tuple[str, Any, dict[str, Any]]] = [
    ("defaults", TEXTS, {}),
    ("one string", "a single query", {}),
    ("dimensions", TEXTS, {"dimensions": 128}),
    ("not normalized", TEXTS, {"normalize": False}),
    ("float16", TEXTS, {"output_dtype": "float16"}),
    ("int8", TEXTS, {"output_dtype": "int8", "dimensions": 64}),
    ("uint8", TEXTS, {"output_dtype": "uint8"}),
    ("binary", TEXTS, {"output_dtype": "binary", "dimensions": 128}),
    ("ubinary", TEXTS, {"output_dtype": "ubinary"}),
    ("truncate end", [LONG, "short"], {"truncate": "end"}),
    ("truncate start", [LONG], {"truncate": "start"}),
    ("truncate chunk", [LONG, "short"], {"truncate": "chunk"}),
    ("chunk with a prompt", [LONG], {"truncate": "chunk", "prompt": "query: "}),
    ("prompt", TEXTS, {"prompt": "query: "}),
    ("input_type", TEXTS, {"input_type": "query"}),
    ("token ids", IDS, {}),
    ("one flat list of ids", IDS[0], {}),
    ("token ids chunked", [[101, *([7592] * 600), 102]], {"truncate": "chunk"}),
]

BAD: list[tuple[str, Any, dict[str, Any]]] = [
    ("empty string", "", {}),
    ("empty list", [], {}),
    ("empty item", ["ok", ""], {}),
    ("mixed types", ["ok", 3], {}),
    ("null item", [None], {}),
    ("empty id list", [[]], {}),
    ("strings in ids", [["nested"]], {}),
    ("id outside the vocabulary", [[101, 999999, 102]], {}),
    ("negative id", [101, -1, 102], {}),
    ("too long", ["short", LONG], {}),
    ("too long ids", [[101, *([7592] * 600), 102]], {}),
    ("dimensions zero", TEXTS, {"dimensions": 0}),
    ("dimensions too large", TEXTS, {"dimensions": 385}),
    ("dimensions a string", TEXTS, {"dimensions": "8"}),
    ("normalize a string", TEXTS, {"normalize": "yes"}),
    ("unknown output_dtype", TEXTS, {"output_dtype": "int4"}),
    ("binary needs multiples of 8", TEXTS, {"output_dtype": "binary", "dimensions": 100}),
    ("unknown truncate", TEXTS, {"truncate": "middle"}),
    ("unknown prompt_name", TEXTS, {"prompt_name": "query"}),
    ("two prompts", TEXTS, {"prompt": "a", "prompt_name": "b"}),
    ("instruction for documents", TEXTS, {"instruction": "x", "input_type": "document"}),
    ("instruction without a template", TEXTS, {"instruction": "Find passages"}),
    ("blank instruction", TEXTS, {"instruction": "  "}),
    ("unknown input_type", TEXTS, {"input_type": "passage"}),
]


def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def as_array(data: list[dict[str, Any]]) -> np.ndarray:
    return np.asarray([d["embedding"] for d in data])


@pytest.mark.parametrize(("name", "inputs", "options"), GOOD, ids=[c[0] for c in GOOD])
def test_same_vectors(
    each_served: str, minilm: Embedder, name: str, inputs: Any, options: dict[str, Any]
) -> None:
    status, body = post(each_served, "/v1/embeddings", {"input": inputs, **options})
    assert status == 200, body
    expected = minilm.encode(inputs, **options)
    got = as_array(body["data"])
    expected = expected.reshape(got.shape)  # one string: a 1-D vector offline
    assert got.dtype.kind == ("f" if expected.dtype.kind == "f" else "i")
    if expected.dtype.kind == "f":
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, expected)
    assert body["usage"]["prompt_tokens"] == sum(
        map(len, minilm.tokenize(inputs, **{k: v for k, v in options.items() if k in PROMPTS}))
    )


PROMPTS = ("prompt", "prompt_name", "input_type", "instruction", "truncate")


@pytest.mark.parametrize(
    ("name", "inputs", "options"),
    [c for c in GOOD if isinstance(c[1], str) or isinstance(c[1][0], str)],
    ids=[c[0] for c in GOOD if isinstance(c[1], str) or isinstance(c[1][0], str)],
)
def test_same_token_ids(
    each_served: str, minilm: Embedder, name: str, inputs: Any, options: dict[str, Any]
) -> None:
    prompts = {k: v for k, v in options.items() if k in PROMPTS}
    if prompts.get("truncate") == "chunk":
        pytest.skip("/tokenize answers texts as the model takes them whole, not windows")
    status, body = post(each_served, "/tokenize", {"input": inputs, **prompts})
    assert status == 200, body
    assert body["tokens"] == minilm.tokenize(inputs, **prompts)


@pytest.mark.parametrize(("name", "inputs", "options"), BAD, ids=[c[0] for c in BAD])
def test_same_errors(
    each_served: str, minilm: Embedder, name: str, inputs: Any, options: dict[str, Any]
) -> None:
    status, body = post(each_served, "/v1/embeddings", {"input": inputs, **options})
    with pytest.raises(ValueError) as offline:
        minilm.encode(inputs, **options)
    assert status == 400, body
    assert body["error"]["message"] == str(offline.value)


def test_same_late_chunking(each_served: str, minilm: Embedder) -> None:
    documents = [["The Eiffel Tower is in Paris.", "It is 330 metres tall."], ["one chunk"]]
    for options in ({}, {"separator": "\n", "dimensions": 64, "output_dtype": "int8"}):
        status, body = post(
            each_served, "/v1/contextualizedembeddings", {"input": documents, **options}
        )
        assert status == 200, body
        expected = minilm.encode_contextual(documents, **options)
        for got, want in zip(body["data"], expected, strict=True):
            np.testing.assert_allclose(as_array(got["data"]), want, rtol=1e-5, atol=1e-6)
    bad = [["a", " "]]
    status, body = post(each_served, "/v1/contextualizedembeddings", {"input": bad})
    with pytest.raises(ValueError) as offline:
        minilm.encode_contextual(bad)
    assert status == 400 and body["error"]["message"] == str(offline.value)
