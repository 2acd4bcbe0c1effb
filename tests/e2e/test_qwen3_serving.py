"""`embedserve serve` on a tiny pplx-style Qwen3 folder (bidirectional, mean pooling, pplx output
rules, native int8): what the server sends equals `Embedder.encode` byte for byte."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.embedder import Embedder
from tests.e2e.conftest import Proc
from tests.e2e.test_replica_failure import call

pytestmark = pytest.mark.slow

TEXTS = [
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "emoji 🙂🚀 and\ttabs",
]


@pytest.fixture(scope="module")
def pplx_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(
        tmp_path_factory.mktemp("pplx"),
        arch="qwen3-tiny",
        attention="bidirectional",
        dtype="float32",
        seed=21,
        max_seq_length=96,
    )


@pytest.fixture(scope="module")
def pplx(pplx_folder: Path) -> Embedder:
    return Embedder(pplx_folder, device="cpu")


@pytest.fixture(scope="module")
def pplx_url(pplx_folder: Path) -> Iterator[str]:
    proc = Proc("serve", "--model", str(pplx_folder), "--port", "0", "--device", "cpu")
    try:
        yield proc.wait_for(r"embedserve: serving \S+ at (\S+)").group(1)
    finally:
        proc.stop()


def decoded(reply: dict[str, Any], dtype: str) -> np.ndarray:
    assert [d["index"] for d in reply["data"]] == list(range(len(reply["data"])))
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype) for d in reply["data"]])


@pytest.mark.parametrize(
    ("output_dtype", "dimensions", "numpy_dtype"),
    [("int8", None, "<i1"), ("int8", 64, "<i1"), ("binary", None, "u1"), ("ubinary", 64, "u1")],
)
def test_native_outputs_equal_the_embedder_byte_for_byte(
    pplx_url: str, pplx: Embedder, output_dtype: str, dimensions: int | None, numpy_dtype: str
) -> None:
    body: dict[str, Any] = {"input": TEXTS, "output_dtype": output_dtype}
    body |= {"encoding_format": "base64_packed", "dimensions": dimensions}
    status, reply = call(pplx_url, "POST", "/v1/embeddings", body)
    assert status == 200, reply
    got = decoded(reply, numpy_dtype)
    want = pplx.encode(TEXTS, output_dtype=output_dtype, dimensions=dimensions)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    # as numbers too (encoding_format "float" carries the same integers)
    status, reply = call(pplx_url, "POST", "/v1/embeddings", {**body, "encoding_format": "float"})
    assert status == 200, reply
    assert np.array([d["embedding"] for d in reply["data"]]).tolist() == want.tolist()


def test_the_default_output_is_the_folders_native_one(pplx_url: str, pplx: Embedder) -> None:
    status, reply = call(pplx_url, "POST", "/v1/embeddings", {"input": TEXTS})
    assert status == 200, reply
    got = np.array([d["embedding"] for d in reply["data"]])
    want = pplx.encode(TEXTS)  # the folder says int8
    assert want.dtype == np.int8
    assert got.tolist() == want.tolist()
    # float32 when asked: the pooled vector, normalized
    status, reply = call(
        pplx_url, "POST", "/v1/embeddings", {"input": TEXTS, "output_dtype": "float32"}
    )
    assert status == 200, reply
    got = np.array([d["embedding"] for d in reply["data"]])
    np.testing.assert_allclose(got, pplx.encode(TEXTS, output_dtype="float32"), atol=1e-6)


@pytest.mark.parametrize("dimensions", [1, 32, 63, 65])
def test_dimensions_outside_the_pplx_range_are_400(pplx_url: str, dimensions: int) -> None:
    # the tiny folder's hidden size is 64, so its range is 64 ... 64 (128 ... hidden when larger)
    status, reply = call(
        pplx_url, "POST", "/v1/embeddings", {"input": "hello", "dimensions": dimensions}
    )
    assert status == 400, reply
    assert reply["error"]["param"] == "dimensions"
    assert reply["error"]["type"] == "invalid_request_error"
    assert "between 64 and 64" in reply["error"]["message"]


def test_attention_kind_and_pooling_flags_reach_the_engine(
    pplx_folder: Path, pplx_url: str
) -> None:
    """`serve --attention causal --pooling last` on a bidirectional folder runs it as a
    Qwen3-Embedding-style model: the vectors equal the Embedder's with the same overrides."""
    proc = Proc(
        "serve",
        *("--model", str(pplx_folder), "--port", "0", "--device", "cpu"),
        *("--attention", "causal", "--pooling", "last"),
    )
    try:
        url = proc.wait_for(r"embedserve: serving \S+ at (\S+)").group(1)
        assert any("causal attention, last pooling" in line for line in proc.lines)
        body = {"input": TEXTS, "output_dtype": "float32"}
        status, reply = call(url, "POST", "/v1/embeddings", body)
        assert status == 200, reply
        got = np.array([d["embedding"] for d in reply["data"]])
    finally:
        proc.stop()
    causal = Embedder(pplx_folder, device="cpu", attention="causal", pooling="last")
    np.testing.assert_allclose(got, causal.encode(TEXTS, output_dtype="float32"), atol=1e-6)
    status, reply = call(pplx_url, "POST", "/v1/embeddings", body)  # the folder's own kind
    assert status == 200, reply
    assert not np.allclose(got, np.array([d["embedding"] for d in reply["data"]]), atol=1e-3)


# --- late chunking over HTTP ------------------------------------------------------------------

CONTEXTUAL = "/v1/contextualizedembeddings"
DOCUMENTS = [
    ["The Eiffel Tower is in Paris.", "It is 330 metres tall.", "Millions of people visit it."],
    ["Rotary embeddings rotate query and key vectors.", "The angle grows with position."],
    ["One chunk."],
]


def documents_of(reply: dict[str, Any], decode: Any = np.asarray) -> list[np.ndarray]:
    assert [d["index"] for d in reply["data"]] == list(range(len(reply["data"])))
    return [np.stack([decode(c["embedding"]) for c in d["data"]]) for d in reply["data"]]


def test_contextual_chunks_equal_encode_contextual(pplx_url: str, pplx: Embedder) -> None:
    body = {"input": DOCUMENTS, "output_dtype": "float32", "normalize": False}
    status, reply = call(pplx_url, "POST", CONTEXTUAL, body)
    assert status == 200, reply
    want = pplx.encode_contextual(DOCUMENTS, output_dtype="float32", normalize=False)
    for got, w, chunks in zip(documents_of(reply), want, DOCUMENTS, strict=True):
        assert got.shape == w.shape == (len(chunks), 64)
        cos = (got * w).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(w, axis=1))
        assert cos.min() >= 0.99999, cos
    # the native default (int8 by the pplx rules), through base64 (packed: its own bytes)
    status, reply = call(
        pplx_url, "POST", CONTEXTUAL, {"input": DOCUMENTS, "encoding_format": "base64_packed"}
    )
    assert status == 200, reply
    got = documents_of(reply, lambda s: np.frombuffer(base64.b64decode(s), "<i1"))
    want = pplx.encode_contextual(DOCUMENTS)
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]


def test_contextual_bad_input_on_the_pplx_folder(pplx_url: str) -> None:
    long_document = ["word " * 60, "word " * 60]  # over the folder's 96 tokens
    for body, code, param in [
        ({"input": [["a"], long_document]}, "context_length_exceeded", "input"),
        ({"input": [["a"]], "dimensions": 32}, "invalid_value", "dimensions"),
        ({"input": [["a"], []]}, "invalid_value", "input"),
    ]:
        status, reply = call(pplx_url, "POST", CONTEXTUAL, body)
        assert status == 400, reply
        assert (reply["error"]["code"], reply["error"]["param"]) == (code, param)
    status, reply = call(pplx_url, "POST", CONTEXTUAL, {"input": [["a"], long_document]})
    assert "input[1] has" in reply["error"]["message"]
    assert "limit of 96" in reply["error"]["message"]
