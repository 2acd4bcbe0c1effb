"""Sequence classification against Hugging Face transformers on the same random weights (fp32,
CPU): each label's probability within 1e-5 of `AutoModelForSequenceClassification` plus the
config's activation (sigmoid for multi-label, else softmax), texts and pairs, for BERT and
XLM-RoBERTa heads; an input alone equals it inside a batch; the folder rules."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.errors import InputError, InputTooLong
from embedserve.loading.spec import ModelLoadError, read_model_spec
from embedserve.scorer import Classifier, Scorer
from tests.data.texts import RERANK_DOCS, RERANK_QUERY

TEXTS = [
    "I loved this film, every minute of it",
    "a terrible, boring plot",
    "ok",
    "Das Essen war ausgezeichnet. 料理はおいしかった。🍣",
    *RERANK_DOCS,
]
PAIRS = [(RERANK_QUERY, d) for d in RERANK_DOCS]
ARCHS = ("minilm-l6-multilabel", "minilm-l6-sentiment", "xlm-roberta-classifier-tiny")


@pytest.fixture(scope="module", params=ARCHS)
def classifier_folder(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp(request.param)
    return make_checkpoint(out, arch=request.param, dtype="float32", seed=3, overwrite=True)


@torch.inference_mode()
def _transformers(folder: Path, inputs: list) -> np.ndarray:  # type: ignore[type-arg]
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    rows = []
    for x in inputs:  # one at a time: no padding in the reference
        enc = tok(*x, return_tensors="pt") if isinstance(x, tuple) else tok(x, return_tensors="pt")
        rows.append(hf(**enc).logits[0])
    logits = torch.stack(rows)
    multi = hf.config.problem_type == "multi_label_classification"
    return (torch.sigmoid(logits) if multi else torch.softmax(logits, -1)).numpy()


def test_probabilities_match_transformers(classifier_folder: Path) -> None:
    clf = Classifier(classifier_folder, device="cpu", dtype="float32")
    inputs = [*TEXTS, *PAIRS]
    got = clf.predict(inputs)
    want = _transformers(classifier_folder, inputs)
    assert got.shape == (len(inputs), len(clf.labels)) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    cfg = json.loads((classifier_folder / "config.json").read_text())
    assert clf.labels == tuple(cfg["id2label"][str(i)] for i in range(len(cfg["id2label"])))
    if cfg.get("problem_type") != "multi_label_classification":
        np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-6)
    # an input alone equals it inside the batch
    alone = np.concatenate([clf.predict([x]) for x in inputs])
    np.testing.assert_allclose(alone, got, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(clf.predict(TEXTS[0]), clf.predict([TEXTS[0]]))


def test_classify_sorts_labels_and_raw_gives_logits(classifier_folder: Path) -> None:
    clf = Classifier(classifier_folder, device="cpu", dtype="float32")
    probs = clf.predict(TEXTS[:2])
    ranked = clf.classify(TEXTS[:2])
    for row, preds in zip(probs, ranked, strict=True):
        assert [p.score for p in preds] == sorted(row.tolist(), reverse=True)
        assert {p.label for p in preds} == set(clf.labels)
    assert len(clf.classify(TEXTS[:1], top_k=2)[0]) == 2
    logits = clf.predict(TEXTS[:2], raw=True)
    np.testing.assert_allclose(clf.preparer.labels.activate(logits), probs, atol=1e-7)


def test_rules_for_long_and_bad_inputs(classifier_folder: Path) -> None:
    clf = Classifier(classifier_folder, device="cpu", dtype="float32")
    long = "word " * 2000
    with pytest.raises(InputTooLong):
        clf.predict([long])
    end, start = clf.predict([long], truncate=True), clf.predict([long], truncate="start")
    assert end.shape == start.shape == (1, len(clf.labels))
    assert clf.predict([(RERANK_QUERY, long)], truncate="end").shape == (1, len(clf.labels))
    for bad in ([], [3], [["a", "b", "c"]], 7):
        with pytest.raises(InputError):
            clf.predict(bad)
    with pytest.raises(InputError, match="truncate"):
        clf.predict(["a"], truncate="chunk")


def test_activation_rule_and_folder_checks(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path / "m", arch="minilm-l6-sentiment", dtype="float32")
    spec = read_model_spec(folder)
    assert spec.task == "classify" and spec.output_width == 3 and spec.pooling == "cls"
    assert spec.labels is not None and spec.labels.activation == "softmax"
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "problem_type": "multi_label_classification"}))
    labels = read_model_spec(folder).labels
    assert labels is not None and labels.activation == "sigmoid"
    cfg_path.write_text(json.dumps({**cfg, "problem_type": "regression"}))
    with pytest.raises(ModelLoadError, match="problem_type"):
        read_model_spec(folder)
    without = {k: v for k, v in cfg.items() if k not in ("id2label", "label2id")}
    cfg_path.write_text(json.dumps({**without, "num_labels": 4}))
    labels = read_model_spec(folder).labels
    assert labels is not None and labels.labels == ("LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3")
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="Classifier"):
        Scorer(folder, device="cpu")
    # a reranker is not a classifier
    ce = make_checkpoint(tmp_path / "ce", arch="ms-marco-minilm-l6", dtype="float32")
    with pytest.raises(ModelLoadError, match="not a sequence classifier"):
        Classifier(ce, device="cpu")
    shutil.rmtree(ce)
