"""A CPU's bf16 linear layers on weights packed once for oneDNN (`engine.layers.linear`): the same
numbers as `F.linear`, bit for bit, for any number of rows; the dense copy's memory released; the
post-ops (a residual sum, an erf GELU) on the fp32 sum at least as close to the exact values as
the separate bf16 operators they replace."""

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


def _layer(rows: int) -> tuple[Linear, torch.Tensor, torch.Tensor]:
    torch.manual_seed(rows)
    layer = Linear(384, 1536, EAGER_OPS).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.normal_(0, 0.05)
        assert layer.bias is not None
        layer.bias.normal_(0, 0.05)
    x = torch.randn(rows, 384, dtype=torch.bfloat16)
    return layer, x, torch.randn(rows, 1536, dtype=torch.bfloat16)


def _exact(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    """The product of the same bf16 values in float64."""
    assert layer.bias is not None
    return x.double() @ layer.weight.double().T + layer.bias.double()


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().mean())


@pytest.mark.parametrize("rows", [1, 7, 300])
def test_post_ops_are_at_least_as_exact_as_separate_operators(rows: int) -> None:
    layer, x, residual = _layer(rows)
    with torch.inference_mode():
        exact_sum = _exact(layer, x) + residual.double()
        exact_gelu = torch.nn.functional.gelu(_exact(layer, x))
        separate_sum, separate_gelu = layer(x) + residual, torch.nn.functional.gelu(layer(x))
        # unpacked, the methods are the separate operators themselves
        assert torch.equal(layer.plus(x, residual), separate_sum)
        assert torch.equal(layer.activated(x, torch.nn.GELU()), separate_gelu)
        layer.pack()
        fused_sum, fused_gelu = layer.plus(x, residual), layer.activated(x, torch.nn.GELU())
        # tanh GELU has no post-op here: the separate operators, bit for bit
        tanh = torch.nn.GELU(approximate="tanh")
        assert torch.equal(layer.activated(x, tanh), tanh(layer(x)))
    assert fused_sum.dtype == fused_gelu.dtype == torch.bfloat16
    assert _error(fused_sum, exact_sum) <= _error(separate_sum, exact_sum)
    assert _error(fused_gelu, exact_gelu) <= _error(separate_gelu, exact_gelu)


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
    # not bit for bit: the packed products' post-ops round once where the separate operators
    # round twice (test above); within bf16's rounding of each other
    got, want = packed.step(batch).wait(), plain.step(batch).wait()
    cosine = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.9999
    # one input alone equals the same input inside the batch
    alone = packed.step(PackedBatch.from_token_lists(ids[1:])).wait()
    np.testing.assert_array_equal(alone[0], packed.step(batch).wait()[1])


def test_float32_is_not_packed(minilm_path: Path) -> None:
    assert Engine.from_folder(minilm_path, device="cpu", dtype="float32").packed_linears == 0
