"""The family registry: one row per family, read without torch or grpc, each row's reader
and its table entry in one place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from embedserve.loading.families import FAMILIES, FAMILY_BY_NAME, family_of, models_table
from embedserve.loading.family_configs import ModelLoadError
from embedserve.loading.spec import ATTENTION_KINDS, POOLING_METHODS, SCORE_ARCHITECTURES


def test_loading_imports_neither_torch_nor_grpc() -> None:
    code = (
        "import sys\n"
        "import embedserve.loading.spec, embedserve.loading.families, embedserve.loading.hub\n"
        "print('torch' in sys.modules, 'grpc' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False False"


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_row_is_complete(family) -> None:  # type: ignore[no-untyped-def]
    module, _, cls = family.model.partition(":")
    assert module.startswith("embedserve.engine.models.") and cls, family.model
    assert family.attention_kinds and set(family.attention_kinds) <= set(ATTENTION_KINDS)
    assert {pool for _, pool in family.pooling_default} <= set(POOLING_METHODS)
    assert family_of({"model_type": family.model_types[0]}, Path("x"))[0] is family
    # a family that scores by logits scores at the last token; a cross-encoder at CLS
    if family.score_architectures:
        assert family.score_pooling == ("last" if family.answer_tokens else "cls")


def test_the_rows_decide_what_only_scores_and_the_table() -> None:
    assert SCORE_ARCHITECTURES == (
        "BertForSequenceClassification",
        "XLMRobertaForSequenceClassification",
        "RobertaForSequenceClassification",
    )
    qwen3 = FAMILY_BY_NAME["qwen3"]
    assert qwen3.scores_by_logits and qwen3.score_kind == "yes_no"
    assert (
        qwen3.default_pooling("causal") == "last"
        and qwen3.default_pooling("bidirectional") == "mean"
    )
    assert FAMILY_BY_NAME["bert"].score_kind == "classifier"
    table = models_table().splitlines()
    assert len(table) == 2 + len(FAMILIES)
    assert "| causal or bidirectional | last (causal), mean (bidirectional) |" in table[-1]
    assert "| bidirectional (local window on 2 of 3 layers) | cls |" in table[6]


def test_an_unknown_family_names_the_supported_ones() -> None:
    with pytest.raises(ModelLoadError, match="unsupported architecture 'T5Model'.*Qwen3Model"):
        family_of({"model_type": "t5", "architectures": ["T5Model"]}, Path("config.json"))
