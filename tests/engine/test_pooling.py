"""Pooling's one-sequence CPU shortcut (`pooling.pool`) against its general path: bit for bit."""

from __future__ import annotations

import pytest
import torch

from embedserve.engine.pooler.pooling import pool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_sequence_pools_to_the_same_bits_as_inside_a_batch(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    alone = torch.randn(13, 384).to(dtype) * 3
    other = torch.randn(5, 384).to(dtype)
    one = pool(alone, torch.tensor([0, 13], dtype=torch.int32), torch.zeros(13, dtype=torch.int64),
               "mean")  # fmt: skip
    both = pool(
        torch.cat([alone, other]),
        torch.tensor([0, 13, 18], dtype=torch.int32),
        torch.tensor([0] * 13 + [1] * 5, dtype=torch.int64),
        "mean",
    )
    assert one.dtype == both.dtype == torch.float32 and one.shape == (1, 384)
    assert torch.equal(one[0], both[0])
    assert torch.allclose(one[0], alone.float().mean(0), rtol=1e-5, atol=1e-6)
