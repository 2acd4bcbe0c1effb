"""Checkpoint names as transformers reads them (`loading.tensor_names`), by name alone."""

from __future__ import annotations

import pytest

from embedserve.loading.families import FAMILY_BY_NAME
from embedserve.loading.family_configs import ModelLoadError
from embedserve.loading.tensor_names import canonical, canonical_names, tied_source


@pytest.mark.parametrize(
    ("family", "name", "ours"),
    [
        ("bert", "bert.embeddings.LayerNorm.gamma", "embeddings.LayerNorm.weight"),
        ("bert", "encoder.layer.0.output.LayerNorm.beta", "encoder.layer.0.output.LayerNorm.bias"),
        ("bert", "cls.predictions.transform.LayerNorm.gamma", "cls.predictions.transform.LayerNorm.weight"),
        ("xlm-roberta", "roberta.encoder.layer.0.attention.self.query.weight", "encoder.layer.0.attention.self.query.weight"),
        ("mpnet", "mpnet.encoder.relative_attention_bias.weight", "encoder.relative_attention_bias.weight"),
        ("nomic-bert", "nomic_bert.emb_ln.weight", "emb_ln.weight"),
        ("modernbert", "model.embeddings.tok_embeddings.weight", "embeddings.tok_embeddings.weight"),
        ("gemma3", "model.language_model.layers.0.mlp.up_proj.weight", "layers.0.mlp.up_proj.weight"),
        ("gemma3", "language_model.model.norm.weight", "norm.weight"),
        ("qwen3", "transformer.norm.weight", "norm.weight"),
        ("qwen3", "lm_head.weight", "lm_head.weight"),  # a head beside the encoder keeps its name
        ("splade", "cls.predictions.bias", "cls.predictions.bias"),
    ],
)  # fmt: skip
def test_each_family_reads_names_as_transformers(family: str, name: str, ours: str) -> None:
    assert canonical(name, FAMILY_BY_NAME[family].prefixes) == ours


def test_every_family_drops_its_base_model_prefix() -> None:
    for family in FAMILY_BY_NAME.values():
        assert family.prefixes and all(p.endswith(".") for p in family.prefixes), family.name


def test_two_names_for_one_tensor_are_an_error() -> None:
    with pytest.raises(ModelLoadError, match="x.safetensors: tensors 'bert.a' and 'a' are both"):
        canonical_names(["bert.a", "a"], ("bert.",), "x.safetensors")


def test_a_tied_weight_left_out_reads_the_one_it_is_tied_to() -> None:
    present = ["embeddings.word_embeddings.weight", "cls.predictions.bias"]
    assert tied_source("cls.predictions.decoder.weight", present) == present[0]
    assert tied_source("cls.predictions.decoder.bias", present) == present[1]
    assert tied_source("lm_head.weight", present) is None
