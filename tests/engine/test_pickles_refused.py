"""Pickled weights are never read (a pickle runs code when loaded, SECURITY.md): the model's and
the Dense modules' alike, each refused with the one line that converts it."""

from __future__ import annotations

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


def _command(message: str) -> list[str]:
    line = message.split("convert with: ", 1)[1].rstrip(")")
    return shlex.split(line)


def test_dense_module_from_pytorch_model_bin_is_refused_then_converted(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    folder = make_checkpoint(tmp_path / "g", arch="gemma3-tiny", dtype="float32", seed=3)
    spec = read_model_spec(folder)
    dense = folder / spec.dense[0].path
    from safetensors.torch import load_file

    tensors = load_file(str(dense / "model.safetensors"))
    (dense / "model.safetensors").unlink()
    torch.save(tensors, dense / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickled weights are refused") as err:
        build_dense(spec)
    # the command it prints converts the file, and the folder then loads
    command = _command(str(err.value))
    assert command[0] == "python"
    subprocess.run([sys.executable, *command[1:]], check=True)
    module = build_dense(spec)
    assert module is not None
    torch.testing.assert_close(module[0].weight, tensors["linear.weight"])


def test_model_weights_from_a_bin_are_refused_with_the_command(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickled weights are refused") as err:
        read_state_dict(tmp_path)
    subprocess.run([sys.executable, *_command(str(err.value))[1:]], check=True)
    torch.testing.assert_close(read_state_dict(tmp_path)["w"], torch.ones(2))
