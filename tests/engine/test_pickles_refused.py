"""Pickled weights are read as transformers reads them, with `torch.load(weights_only=True)`:
a `pytorch_model.bin` of tensors loads (the model's and a Dense module's alike); a pickle that
needs anything more is refused before any of its code runs (SECURITY.md); other pickle names
are refused with the one line that converts them."""

from __future__ import annotations

import pickle
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.engine.pooler.dense import build_dense
from embedserve.engine.weights import read_state_dict
from embedserve.loading.spec import ModelLoadError, read_model_spec


def test_dense_module_from_pytorch_model_bin_loads(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    folder = make_checkpoint(tmp_path / "g", arch="gemma3-tiny", dtype="float32", seed=3)
    spec = read_model_spec(folder)
    dense = folder / spec.dense[0].path
    from safetensors.torch import load_file

    tensors = load_file(str(dense / "model.safetensors"))
    (dense / "model.safetensors").unlink()
    torch.save(tensors, dense / "pytorch_model.bin")  # as sentence-transformers 2 saved it
    module = build_dense(spec)
    assert module is not None
    torch.testing.assert_close(module[0].weight, tensors["linear.weight"])


def test_model_weights_from_a_bin_load_sharded_too(tmp_path: Path) -> None:
    torch.save({"a.weight": torch.ones(2)}, tmp_path / "pytorch_model-1.bin")
    torch.save({"b.LayerNorm.gamma": torch.zeros(3)}, tmp_path / "pytorch_model-2.bin")
    index = '{"weight_map": {"a.weight": "pytorch_model-1.bin", "b.LayerNorm.gamma": "pytorch_model-2.bin"}}'
    (tmp_path / "pytorch_model.bin.index.json").write_text(index)
    state = read_state_dict(tmp_path)
    torch.testing.assert_close(state["a.weight"], torch.ones(2))
    torch.testing.assert_close(state["b.LayerNorm.weight"], torch.zeros(3))  # legacy name


class _RunsCode:
    """A pickle that calls a function when loaded (what `weights_only=True` refuses)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (str(MARKER),))


MARKER = Path("/tmp/embedserve-pickle-ran")


def test_a_pickle_that_runs_code_is_refused_before_it_runs(tmp_path: Path) -> None:
    MARKER.unlink(missing_ok=True)
    with (tmp_path / "pytorch_model.bin").open("wb") as f:
        pickle.dump({"w": _RunsCode()}, f)
    with pytest.raises(ModelLoadError, match=r"pytorch_model\.bin: not a plain tensor file"):
        read_state_dict(tmp_path)
    assert not MARKER.exists()


def test_other_pickles_are_refused_with_the_command(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "weights.pt")
    with pytest.raises(ModelLoadError, match="convert with: ") as err:
        read_state_dict(tmp_path)
    line = str(err.value).split("convert with: ", 1)[1].rstrip(")")
    subprocess.run([sys.executable, *shlex.split(line)[1:]], check=True)
    torch.testing.assert_close(read_state_dict(tmp_path)["w"], torch.ones(2))
