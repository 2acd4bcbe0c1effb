"""An older sentence-transformers folder (the transformer in `0_Transformer/`) served as
sentence-transformers loads it (`loading.st_subfolder`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from embedserve.loading.bundled import resolve_model
from embedserve.loading.family_configs import ModelLoadError
from embedserve.loading.st_subfolder import flat_view

TRANSFORMER_FILES = (
    "config.json",
    "model.safetensors",
    "sentence_bert_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
)
TEXTS = ["a query about the weather", "Paris is the capital of France.", "x"]


def old_layout(out: Path, sub: str = "0_Transformer") -> Path:
    """The bundled MiniLM saved as older sentence-transformers versions saved it."""
    source = resolve_model("minilm")
    (out / sub).mkdir(parents=True)
    for name in TRANSFORMER_FILES:
        shutil.copy(source / name, out / sub / name)
    shutil.copytree(source / "1_Pooling", out / "1_Pooling")
    shutil.copy(source / "config_sentence_transformers.json", out)
    modules = json.loads((source / "modules.json").read_text())
    modules[0]["path"] = sub
    (out / "modules.json").write_text(json.dumps(modules))
    return out


def test_an_older_folder_embeds_as_sentence_transformers_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sentence_transformers import SentenceTransformer

    from embedserve import Embedder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = old_layout(tmp_path / "old")
    ours = Embedder(str(folder), device="cpu", dtype="float32").encode(TEXTS)
    reference = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    cosine = (ours * reference).sum(1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.99999


def test_the_view_links_the_files_once_and_a_flat_folder_is_itself(tmp_path: Path) -> None:
    folder = old_layout(tmp_path / "old", sub="0_BERT")
    view = flat_view(folder, cache=tmp_path / "views")
    assert flat_view(folder, cache=tmp_path / "views") == view
    assert (view / "config.json").is_symlink()
    assert (view / "config.json").resolve() == (folder / "0_BERT" / "config.json").resolve()
    assert (view / "1_Pooling").resolve() == (folder / "1_Pooling").resolve()
    modules = json.loads((view / "modules.json").read_text())
    assert modules[0]["path"] == ""
    flat = resolve_model("minilm")
    assert flat_view(flat, cache=tmp_path / "views") == flat


def test_a_transformer_subfolder_without_its_config_is_named(tmp_path: Path) -> None:
    folder = old_layout(tmp_path / "old")
    (folder / "0_Transformer" / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"0_Transformer/config\.json: not found"):
        flat_view(folder, cache=tmp_path / "views")
