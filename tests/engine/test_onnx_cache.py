"""The ONNX graph cache under what users' machines do to it (faults IV): an unwritable cache, a
graph this onnxruntime cannot load, a recorded folder behind a broken link, writes killed midway.
A path that cannot be built hands over to the next one; none of it stops a start."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from embedserve.engine import cpu, cpu_paths, onnx_encoder
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.engine.onnx_encoder import SOURCE, OnnxEncoder, cache_path, prune_stale
from embedserve.engine.onnx_graph import IR_VERSION

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

BATCH = PackedBatch.from_token_lists([[101, 2054, 2003, 1037, 3231, 102]])


@pytest.fixture(autouse=True)
def _float32_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Choices remembered per test; float32 by default, as on a CPU without native bf16."""
    monkeypatch.setattr(cpu_paths, "_choices_file", lambda: tmp_path / "cpu-paths.json")
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)


def test_an_unwritable_cache_still_serves_onnx(
    tmp_path: Path, minilm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a cache under a file cannot be made, even by root (HOME=/nonexistent, a read-only root)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    cached = Engine.from_folder(minilm_path, device="cpu", cpu_path="onnx")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    engine = Engine.from_folder(minilm_path, device="cpu", cpu_path="onnx")
    assert engine.cpu_path == "onnx" and not str(engine.model.path).startswith(str(blocker))
    np.testing.assert_array_equal(engine.step(BATCH).wait(), cached.step(BATCH).wait())
    # the auto choice with the choices file unwritable too
    monkeypatch.setattr(cpu_paths, "_choices_file", lambda: blocker / "cpu-paths.json")
    assert Engine.from_folder(minilm_path, device="cpu", dtype=None).cpu_choice is not None


def test_a_path_that_cannot_be_built_hands_over(
    minilm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unloadable(*args: object) -> None:
        raise RuntimeError("Unsupported model IR version: 11, max supported IR version: 10")

    monkeypatch.setattr(OnnxEncoder, "__init__", unloadable)
    engine = Engine.from_folder(minilm_path, device="cpu", dtype=None)
    choice = engine.cpu_choice
    assert choice is not None and choice.path in ("packed", "eager")
    assert "not built" in choice.dropped["onnx"] and "IR version" in choice.dropped["onnx"]
    with pytest.raises(RuntimeError, match="IR version"):  # asked by name: the user hears why
        Engine.from_folder(minilm_path, device="cpu", cpu_path="onnx")


def test_the_graph_loads_in_the_oldest_allowed_onnxruntime(minilm_path: Path) -> None:
    path = Engine.from_folder(minilm_path, device="cpu", cpu_path="onnx").model.path
    # onnxruntime 1.20 (pyproject's floor) loads IR 10 at most
    assert IR_VERSION <= 10
    assert onnx.load(str(path), load_external_data=False).ir_version == IR_VERSION


def test_the_key_names_the_config_and_the_libraries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text('{"num_hidden_layers": 6}')
    before = cache_path(folder)
    (folder / "config.json").write_text('{"num_hidden_layers": 3}')
    after = cache_path(folder)
    assert after != before
    monkeypatch.setattr(onnx_encoder, "_versions", lambda: "onnx=1.18.0,onnxruntime=1.20.0")
    assert cache_path(folder) != after


def _recorded(root: Path, name: str, folder: Path) -> Path:
    entry = root / name
    entry.mkdir(parents=True)
    (entry / "model.onnx").write_bytes(b"graph")
    (entry / SOURCE).write_text(json.dumps({"folder": str(folder)}))
    return entry


def test_prune_tolerates_broken_links_and_removes_abandoned_writes(tmp_path: Path) -> None:
    root = tmp_path / "onnx"
    folder = tmp_path / "st-layout"
    folder.mkdir()
    # an old sentence-transformers layout's flat view: its weights link into a deleted folder
    (folder / "model.safetensors").symlink_to(tmp_path / "deleted" / "model.safetensors")
    broken = _recorded(root, "broken", folder)
    live_folder = tmp_path / "live"
    live_folder.mkdir()
    (live_folder / "model.safetensors").write_bytes(b"w")
    live = cache_path(live_folder, root).parent
    _recorded(root, live.name, live_folder)
    killed = root / ".tmp-killed"  # a write killed a day ago
    killed.mkdir()
    (killed / "model.onnx.data").write_bytes(b"x" * 100)
    day_ago = time.time() - onnx_encoder.ABANDONED_S - 60
    os.utime(killed, (day_ago, day_ago))
    writing = root / ".tmp-writing"  # another start writing now
    writing.mkdir()
    assert prune_stale(root) >= 100
    assert not broken.exists() and not killed.exists()
    assert live.exists() and writing.exists()


def test_prune_skips_what_another_process_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "onnx"
    gone = _recorded(root, "gone", tmp_path / "deleted")
    removed_first = onnx_encoder._stale

    def raced(entry: Path, at: Path) -> bool:  # a second server removes it meanwhile
        stale = removed_first(entry, at)
        shutil.rmtree(entry)
        return stale

    monkeypatch.setattr(onnx_encoder, "_stale", raced)
    assert prune_stale(root) == 0 and not gone.exists()
    assert prune_stale(tmp_path / "no-cache-yet") == 0
