"""What a Qwen3 folder declares: attention kind, pooling, native output; and clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from embedserve.devtools.checkpoints import qwen3_config
from embedserve.loading.spec import ModelLoadError, read_model_spec


def folder(tmp_path: Path, config: dict[str, Any], files: dict[str, Any] | None = None) -> Path:
    """A model folder with this config.json and other JSON files (by relative path)."""
    for name, content in {"config.json": config, **(files or {})}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content))
    return tmp_path


def test_defaults_follow_the_attention_kind(tmp_path: Path) -> None:
    spec = read_model_spec(folder(tmp_path, qwen3_config("qwen3-0.6b", "causal")))
    assert (spec.family, spec.attention, spec.pooling) == ("qwen3", "causal", "last")
    assert spec.qwen3 is not None and spec.bert is None
    assert (spec.qwen3.num_heads, spec.qwen3.num_kv_heads, spec.qwen3.head_dim) == (16, 8, 128)
    assert spec.qwen3.rope_theta == 1_000_000.0
    assert (spec.vocab_size, spec.max_position_embeddings, spec.type_vocab_size) == (
        151669,
        32768,
        1,
    )
    assert (spec.output_rules, spec.default_output_dtype) == ("generic", "float32")

    bi = read_model_spec(folder(tmp_path, qwen3_config("qwen3-0.6b", "bidirectional")))
    assert (bi.attention, bi.pooling) == ("bidirectional", "mean")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"use_bidirectional_attention": True}, "bidirectional"),
        ({"is_causal": True}, "causal"),
        ({"is_causal": False}, "bidirectional"),
    ],
)
def test_config_keys_for_attention(tmp_path: Path, extra: dict[str, Any], expected: str) -> None:
    cfg = {**qwen3_config("qwen3-tiny", "causal"), **extra}
    assert read_model_spec(folder(tmp_path, cfg)).attention == expected


def test_embedserve_json_and_overrides(tmp_path: Path) -> None:
    cfg = qwen3_config("qwen3-tiny", "causal")
    extra = {"attention": "bidirectional", "output_rules": "pplx", "default_output_dtype": "binary"}
    path = folder(tmp_path, cfg, {"embedserve.json": extra})
    spec = read_model_spec(path)
    assert (spec.attention, spec.pooling) == ("bidirectional", "mean")
    assert (spec.output_rules, spec.default_output_dtype) == ("pplx", "binary")
    spec = read_model_spec(path, attention="causal", pooling="mean")
    assert (spec.attention, spec.pooling) == ("causal", "mean")
    with pytest.raises(ValueError, match="attention 'sideways'"):
        read_model_spec(path, attention="sideways")


@pytest.mark.parametrize(
    ("pool_cfg", "expected"),
    [
        ({"pooling_mode_lasttoken": True}, "last"),
        ({"pooling_mode_mean_tokens": True}, "mean"),
        ({"pooling_mode": "lasttoken"}, "last"),  # sentence-transformers 6 writes this key
        ({"pooling_mode": "mean"}, "mean"),
    ],
)
def test_pooling_from_the_folder(tmp_path: Path, pool_cfg: dict[str, Any], expected: str) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    cfg = qwen3_config("qwen3-tiny", "bidirectional")
    path = folder(tmp_path, cfg, {"modules.json": modules, "1_Pooling/config.json": pool_cfg})
    assert read_model_spec(path).pooling == expected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"model_type": "llama", "architectures": ["LlamaModel"]}, "Qwen3Model"),
    ],
)
def test_unsupported_configs(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    cfg = {**qwen3_config("qwen3-tiny", "causal"), **change}
    with pytest.raises(ModelLoadError, match=message):
        read_model_spec(folder(tmp_path, cfg))


def test_bad_native_output(tmp_path: Path) -> None:
    (tmp_path / "embedserve.json").write_text(json.dumps({"output_rules": "fancy"}))
    with pytest.raises(ModelLoadError, match="output_rules 'fancy'"):
        read_model_spec(folder(tmp_path, qwen3_config("qwen3-tiny", "causal")))
    (tmp_path / "embedserve.json").write_text(json.dumps({"default_output_dtype": "int4"}))
    with pytest.raises(ModelLoadError, match="default_output_dtype 'int4'"):
        read_model_spec(tmp_path)


def test_bert_stays_bidirectional(minilm_path: Path) -> None:
    spec = read_model_spec(minilm_path)
    assert (spec.family, spec.attention, spec.pooling) == ("bert", "bidirectional", "mean")
    assert spec.vocab_size == 30522 and spec.type_vocab_size == 2
    with pytest.raises(ValueError, match="bidirectional"):
        read_model_spec(minilm_path, attention="causal")
