"""Sequence classification over HTTP with real processes: `embedserve serve` on a multi-label
classifier folder (random weights, the MiniLM-L6 shape), TEI's `/predict` through
`huggingface_hub.InferenceClient` and plain HTTP, vLLM's `/classify`; answers equal the offline
`Classifier`'s; the embedding and rerank routes refuse the model; `/openapi.json` lists both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.scorer import Classifier
from tests.data.texts import RERANK_DOCS, RERANK_QUERY
from tests.e2e.conftest import Proc
from tests.e2e.test_rerank_serving import post

TEXTS = ["I loved this film", "a terrible, boring plot", *RERANK_DOCS[:3]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("multilabel-serve")
    return make_checkpoint(out, arch="minilm-l6-multilabel", dtype="float32", seed=4)


@pytest.fixture(scope="module")
def offline(folder: Path) -> Classifier:
    return Classifier(folder, device="cpu")


@pytest.fixture(scope="module")
def url(folder: Path) -> Iterator[str]:
    proc = Proc("serve", "--model", str(folder), "--port", "0", "--device", "cpu",
                "--served-model-name", "toxic")  # fmt: skip
    try:
        yield proc.wait_for(r"embedserve: serving \S+ at (\S+)").group(1)
    finally:
        proc.stop()


def test_inference_client_text_classification(
    url: str, offline: Classifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import InferenceClient, constants

    # a local server is no Hub: the offline mode a Hub test may have left on does not apply
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    client = InferenceClient(model=url + "/predict")
    want = offline.classify(TEXTS[0])[0]
    # TEI answers one input with a flat list; the client reads its first item, the top label
    top = client.text_classification(TEXTS[0])
    assert top.label == want[0].label  # type: ignore[attr-defined]
    assert abs(top.score - want[0].score) < 1e-5  # type: ignore[attr-defined]


def test_predict_matches_the_offline_classifier(url: str, offline: Classifier) -> None:
    status, answer = post(url, "/predict", {"inputs": TEXTS})
    assert status == 200 and len(answer) == len(TEXTS)
    for got, want in zip(answer, offline.classify(TEXTS), strict=True):
        assert [p["label"] for p in got] == [p.label for p in want]
        np.testing.assert_allclose([p["score"] for p in got], [p.score for p in want], atol=1e-5)
        assert [p["score"] for p in got] == sorted((p["score"] for p in got), reverse=True)
    # one input: one flat list; a pair at the top is one pair (as TEI reads it)
    status, one = post(url, "/predict", {"inputs": TEXTS[1]})
    assert status == 200 and {p["label"] for p in one} == set(offline.labels)
    status, pair = post(url, "/predict", {"inputs": [RERANK_QUERY, RERANK_DOCS[0]]})
    want_pair = offline.predict([(RERANK_QUERY, RERANK_DOCS[0])])[0]
    assert status == 200
    got_pair = {p["label"]: p["score"] for p in pair}
    np.testing.assert_allclose([got_pair[x] for x in offline.labels], want_pair, atol=1e-5)
    status, raw = post(url, "/predict", {"inputs": [TEXTS[0]], "raw_scores": True})
    logits = offline.predict([TEXTS[0]], raw=True)[0]
    got_raw = {p["label"]: p["score"] for p in raw[0]}
    np.testing.assert_allclose([got_raw[x] for x in offline.labels], logits, atol=1e-4)
    status, top = post(url, "/predict", {"inputs": TEXTS[0], "parameters": {"top_k": 2}})
    assert status == 200 and len(top) == 2
    status, cut = post(url, "/predict", {"inputs": "word " * 2000, "truncate": True})
    assert status == 200 and len(cut) == len(offline.labels)
    status, error = post(url, "/predict", {"inputs": "word " * 2000})
    assert status == 400 and error["error"]["code"] == "context_length_exceeded"


def test_vllm_classify_shape(url: str, offline: Classifier) -> None:
    status, answer = post(url, "/classify", {"model": "toxic", "input": TEXTS})
    assert status == 200, answer
    assert answer["object"] == "list" and answer["model"] == "toxic"
    assert answer["id"].startswith("classify-") and isinstance(answer["created"], int)
    want = offline.predict(TEXTS)
    for i, item in enumerate(answer["data"]):
        assert item["index"] == i and item["num_classes"] == len(offline.labels)
        np.testing.assert_allclose(item["probs"], want[i], atol=1e-5)
        assert item["label"] == offline.labels[int(np.argmax(want[i]))]
    assert answer["usage"]["prompt_tokens"] > 0
    status, error = post(url, "/classify", {"model": "other", "input": "x"})
    assert status == 404 and error["error"]["code"] == "model_not_found"


def test_other_routes_refuse_a_classifier(url: str) -> None:
    for path, body in (
        ("/v1/embeddings", {"input": "a text"}),
        ("/v1/rerank", {"query": "q", "documents": ["d"]}),
        ("/v1/score", {"text_1": "q", "text_2": ["d"]}),
    ):
        status, error = post(url, path, body)
        assert status == 400 and error["error"]["code"] == "wrong_model_task", (path, error)
    import json
    import urllib.request

    with urllib.request.urlopen(url + "/openapi.json", timeout=30) as reply:
        doc = json.loads(reply.read())
    assert {"/predict", "/classify"} <= set(doc["paths"])
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as reply:
        assert json.loads(reply.read())["data"][0]["task"] == "classify"


def test_info_names_a_classifier_and_its_labels(url: str, offline: Classifier) -> None:
    import json
    import urllib.request

    with urllib.request.urlopen(url + "/info", timeout=30) as reply:
        info = json.loads(reply.read())
    labels = list(offline.spec.labels.labels)  # type: ignore[union-attr]
    assert info["model_type"] == {
        "classifier": {
            "id2label": {str(i): label for i, label in enumerate(labels)},
            "label2id": {label: i for i, label in enumerate(labels)},
        }
    }
