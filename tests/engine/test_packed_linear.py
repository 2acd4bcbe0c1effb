"""A CPU's bf16 linear layers on weights packed once for oneDNN (`engine.layers.linear`): the same
numbers as `F.linear`, bit for bit, for any number of rows; the dense copy's memory released."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import embedserve.engine.engine as engine_module
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.engine.layers.linear import Linear, can_pack
from embedserve.engine.ops import EAGER_OPS

pytestmark = pytest.mark.skipif(
    not can_pack(torch.device("cpu"), torch.bfloat16), reason="PyTorch without oneDNN"
)


@pytest.mark.parametrize("rows", [1, 7, 16, 300])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_layer_equals_f_linear_bitwise(rows: int, bias: bool) -> None:
    torch.manual_seed(rows)
    layer = Linear(384, 1536, EAGER_OPS, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.normal_(0, 0.05)
        if layer.bias is not None:
            layer.bias.normal_(0, 0.05)
    x = torch.randn(rows, 384, dtype=torch.bfloat16)
    with torch.inference_mode():
        want = layer(x)
        layer.pack()
        got = layer(x)
    assert layer.packed is not None and torch.equal(got, want)
    # the dense values are gone (one element behind a broadcast), their shape and dtype kept
    assert layer.weight.shape == (1536, 384) and layer.weight.dtype == torch.bfloat16
    assert layer.weight.untyped_storage().nbytes() == 2


def test_engine_packs_in_bf16_and_answers_as_unpacked(
    minilm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [[101, 2129, 2079, 1045, 102], [101, 2054, 2003, 1996, 3007, 1997, 2605, 102]]
    batch = PackedBatch.from_token_lists(ids)
    packed = Engine.from_folder(minilm_path, device="cpu", dtype="bfloat16")
    assert packed.packed_linears == 6 * 4  # per layer: qkv, attention out, up, down
    monkeypatch.setattr(engine_module, "can_pack", lambda device, dtype: False)
    plain = Engine.from_folder(minilm_path, device="cpu", dtype="bfloat16")
    assert plain.packed_linears == 0
    np.testing.assert_array_equal(packed.step(batch).wait(), plain.step(batch).wait())
    # one input alone equals the same input inside the batch
    alone = packed.step(PackedBatch.from_token_lists(ids[1:])).wait()
    np.testing.assert_array_equal(alone[0], packed.step(batch).wait()[1])


def test_float32_is_not_packed(minilm_path: Path) -> None:
    assert Engine.from_folder(minilm_path, device="cpu", dtype="float32").packed_linears == 0
