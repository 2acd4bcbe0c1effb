"""Models by Hugging Face Hub id, read from a Hub cache laid out as huggingface_hub lays it out
(no network here: HF_HUB_OFFLINE=1), and the errors when the id is not there."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from embedserve.embedder import Embedder
from embedserve.loading.bundled import resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path: Path, minilm_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache holding sentence-transformers/all-MiniLM-L6-v2 at `main` and at a tag."""
    cache = tmp_path / "hf" / "hub"
    repo = cache / "models--sentence-transformers--all-MiniLM-L6-v2"
    shutil.copytree(
        minilm_path, repo / "snapshots" / COMMIT, ignore=shutil.ignore_patterns("README.md")
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "refs" / "v1").write_text(COMMIT)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_hub_id_in_the_cache_loads_like_the_folder(hub_cache: Path, minilm: Embedder) -> None:
    folder = resolve_model("sentence-transformers/all-MiniLM-L6-v2")
    assert folder.name == COMMIT and folder.is_relative_to(hub_cache)
    assert resolve_model("sentence-transformers/all-MiniLM-L6-v2@v1") == folder
    by_id = Embedder("sentence-transformers/all-MiniLM-L6-v2", device="cpu", dtype="float32")
    np.testing.assert_array_equal(by_id.encode(["a query"]), minilm.encode(["a query"]))


def test_offline_without_the_model_names_the_id_and_the_cache(hub_cache: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"'org/missing' is not in the Hugging Face cache \(.*hub\) and HF_HUB_OFFLINE",
    ):
        resolve_model("org/missing")
    with pytest.raises(ValueError, match="neither a bundled name"):
        resolve_model("not a model")  # neither a folder nor an id


def test_the_served_model_name_of_a_hub_id_is_the_id() -> None:
    from embedserve.gateway.main import GatewayConfig

    config = GatewayConfig(replicas=("127.0.0.1:1",), models=("BAAI/bge-small-en-v1.5@main",))
    assert config.model_names == ("BAAI/bge-small-en-v1.5",)
