"""A CPU's bf16 linear layers on weights packed once for oneDNN (`engine.layers.linear`): the same
numbers as `F.linear`, bit for bit, for any number of rows; the dense copy's memory released; the
products that end in their activation or residual sum (post-ops) equal the fp32 computation
rounded once to bf16."""

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


def _packed_layer(rows: int) -> tuple[Linear, torch.Tensor]:
    torch.manual_seed(rows)
    layer = Linear(384, 1536, EAGER_OPS).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.normal_(0, 0.05)
        layer.bias.normal_(0, 0.05)  # type: ignore[union-attr]
    return layer, torch.randn(rows, 384, dtype=torch.bfloat16)


def _fp32_product(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    assert layer.bias is not None
    return torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())


# the fp32 value rounded once to bf16 (8 bits of mantissa), give or take the sums' order
ONE_ROUNDING = {"rtol": 2**-7, "atol": 2**-10}


@pytest.mark.parametrize("rows", [1, 11, 300])
@pytest.mark.parametrize(
    "activation", [torch.nn.GELU(), torch.nn.GELU(approximate="tanh"), torch.nn.ReLU()]
)
def test_packed_product_with_its_activation_fused(rows: int, activation: torch.nn.Module) -> None:
    layer, x = _packed_layer(rows)
    want = activation(_fp32_product(layer, x))
    unfused = layer.act(x, activation)  # not packed yet: the two ops
    with torch.inference_mode():
        layer.pack()
        got = layer.act(x, activation)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, **ONE_ROUNDING)
    torch.testing.assert_close(unfused.float(), want, **ONE_ROUNDING)


@pytest.mark.parametrize("rows", [1, 11, 300])
def test_packed_product_with_its_residual_sum_fused(rows: int) -> None:
    layer, x = _packed_layer(rows)
    residual = torch.randn(rows, 1536, dtype=torch.bfloat16)
    want = _fp32_product(layer, x) + residual.float()
    with torch.inference_mode():
        layer.pack()
        got = layer.add(x, residual)
    torch.testing.assert_close(got.float(), want, **ONE_ROUNDING)


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
    reference = Engine.from_folder(minilm_path, device="cpu", dtype="float32").step(batch).wait()
    # the packed forward rounds once where the unpacked one rounds after each op (the post-ops):
    # not bit for bit, but as close to fp32 as bf16 allows
    for got in (packed.step(batch).wait(), plain.step(batch).wait()):
        cosine = (
            np.sum(got * reference, 1)
            / np.linalg.norm(got, axis=1)
            / np.linalg.norm(reference, axis=1)
        )
        assert cosine.min() >= 0.9999, cosine
    # one input alone equals the same input inside the batch
    alone = packed.step(PackedBatch.from_token_lists(ids[1:])).wait()
    np.testing.assert_array_equal(alone[0], packed.step(batch).wait()[1])


def test_float32_is_not_packed(minilm_path: Path) -> None:
    assert Engine.from_folder(minilm_path, device="cpu", dtype="float32").packed_linears == 0
