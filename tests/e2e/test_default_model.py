"""`serve --default-model`: two embedders behind one gateway, and the clients that cannot name a
model (huggingface_hub's `InferenceClient`, which posts TEI's `POST /`; `/info`) reach the default
one; a request that names a model still gets it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import huggingface_hub as hub
import numpy as np
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.embedder import Embedder
from tests.e2e.conftest import Proc
from tests.e2e.test_multi_model import get
from tests.e2e.test_rerank_serving import post

pytestmark = pytest.mark.slow

TEXTS = ["vector search with embeddings", "a second text, a little longer than the first"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("default-model") / "xlmr"
    return make_checkpoint(out, arch="xlm-roberta-tiny", dtype="float32", seed=7)


@pytest.fixture(scope="module")
def serving(tiny: Path) -> Iterator[tuple[str, Proc]]:
    proc = Proc("serve", "--model", "minilm", "--model", f"tiny={tiny}", "--default-model",
                "tiny", "--port", "0", "--device", "cpu", "--dtype", "float32")  # fmt: skip
    try:
        yield proc.wait_for(r"embedserve: serving minilm, tiny at (\S+)").group(1), proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def url(serving: tuple[str, Proc]) -> str:
    return serving[0]


def test_the_ready_lines_name_the_served_names(serving: tuple[str, Proc], tiny: Path) -> None:
    proc = serving[1]
    # a server process's line, or natively its engine's (`serve`'s default)
    ready = r"embedserve server: ready (?:on \S+|in this process)"
    proc.wait_for(rf"{ready} \(serving tiny: {tiny}, ")
    proc.wait_for(rf"{ready} \(serving minilm: ")
    proc.wait_for(r"embedserve: serving minilm, tiny at ")


def test_inference_client_reaches_the_default_model(url: str, tiny: Path, minilm: Embedder) -> None:
    want = Embedder(tiny, device="cpu", dtype="float32").encode(TEXTS)
    client = hub.InferenceClient(model=url)
    got = np.asarray(client.feature_extraction(TEXTS))
    assert got.shape == want.shape and want.shape[1] != 384  # the tiny model, not MiniLM's
    np.testing.assert_allclose(got, want, atol=1e-5)
    similarity = client.sentence_similarity(TEXTS[0], TEXTS[1:])
    assert similarity == pytest.approx([float(want[0] @ want[1])], abs=1e-5)
    # a route that takes a model name still takes it
    status, reply = post(url, "/v1/embeddings", {"input": TEXTS, "model": "minilm"})
    assert status == 200 and reply["model"] == "minilm"
    np.testing.assert_allclose([d["embedding"] for d in reply["data"]], minilm.encode(TEXTS),
                               atol=1e-5)  # fmt: skip
    status, reply = post(url, "/v1/embeddings", {"input": TEXTS})
    assert status == 200 and reply["model"] == "tiny"
    # TEI's `/embed` names no model: the default's (natively, the Python front's pick)
    status, rows = post(url, "/embed", {"inputs": TEXTS})
    assert status == 200
    np.testing.assert_allclose(rows, want, atol=1e-5)


def test_info_states_the_default(url: str) -> None:
    status, info = get(url, "/info")
    assert status == 200
    assert info["model_id"] == "tiny" and info["default_for"] == ["any", "embed"]
