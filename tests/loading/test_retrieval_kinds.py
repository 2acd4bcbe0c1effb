"""The retrieval-kind registry: each row is whole (a family binds it to an encoder, its heads are
a class of the engine, its rules agree with its outputs), and the readers that used to test a
kind's name read the row."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from embedserve.loading.families import RETRIEVAL_FAMILIES
from embedserve.loading.retrieval import OUTPUTS
from embedserve.loading.retrieval_kinds import KIND_BY_NAME, RETRIEVAL_KINDS
from embedserve.retrieval.results import DEFAULT_OUTPUTS_RULE
from embedserve.retrieval.scores import late_plan


def test_every_kind_has_one_family_and_every_family_a_kind() -> None:
    assert sorted(f.marker for f in RETRIEVAL_FAMILIES) == sorted(KIND_BY_NAME)
    assert len(KIND_BY_NAME) == len(RETRIEVAL_KINDS)


@pytest.mark.parametrize("kind", RETRIEVAL_KINDS, ids=lambda k: k.name)
def test_a_rows_rules_agree_with_its_outputs(kind: object) -> None:
    from embedserve.loading.retrieval_kinds import RetrievalKind

    assert isinstance(kind, RetrievalKind)
    assert kind.outputs and set(kind.outputs) <= set(OUTPUTS)
    # a multi-vector output says which tokens give its rows; no other kind names a rule
    assert bool(kind.multivector_tokens) == ("multivector" in kind.outputs)
    assert not kind.token_dense or "multivector" in kind.outputs
    # a score that takes weights weighs one score per output (bge-m3's dense, sparse, colbert)
    assert not kind.score_weights or len(kind.score_weights) == len(kind.outputs)
    plan = late_plan(kind.name)
    assert plan.outputs == kind.outputs and plan.score == kind.score
    assert (plan.query_type, plan.document_type) == kind.score_input_types


@pytest.mark.parametrize("kind", RETRIEVAL_KINDS, ids=lambda k: k.name)
def test_a_rows_heads_are_an_engine_class(kind: object) -> None:
    pytest.importorskip("torch")
    from embedserve.engine.retrieval import RetrievalHeads
    from embedserve.loading.retrieval_kinds import RetrievalKind

    assert isinstance(kind, RetrievalKind)
    module, _, name = kind.heads.partition(":")
    assert issubclass(getattr(importlib.import_module(module), name), RetrievalHeads)


def test_the_registry_imports_no_torch() -> None:
    """The gateway reads folders and rows with it."""
    code = (
        "import sys, embedserve.loading.retrieval_kinds, embedserve.retrieval.scores; "
        "sys.exit('torch' in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_weights_name_the_kinds_rule() -> None:
    from embedserve.errors import InputError

    with pytest.raises(InputError, match=r"weights are bge-m3's \(dense, sparse, colbert\); "
                       "this colbert model scores by MaxSim alone"):  # fmt: skip
        late_plan("colbert", [1, 1, 1])
    with pytest.raises(InputError, match="this splade model scores by the sparse dot product"):
        late_plan("splade", [1, 1, 1])
    assert late_plan("bge-m3", [1, 2, 3]).weights == (1.0, 2.0, 3.0)


def test_the_default_outputs_rule_is_built_from_the_rows() -> None:
    assert DEFAULT_OUTPUTS_RULE == (
        "dense, or every output of a model without dense vectors (SPLADE: sparse; ColBERT: "
        "multivector)"
    )
