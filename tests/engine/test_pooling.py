"""Pooling: one sequence alone and inside a batch, and the NumPy twin `pool_host` against the
torch path, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedserve.engine.pooler.pooling import pool, pool_host


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


@pytest.mark.parametrize("method", ["mean", "cls", "last"])
@pytest.mark.parametrize("seqlens", [[13], [13, 5, 1, 40]])
def test_the_host_pooling_gives_the_torch_poolings_bits(method: str, seqlens: list[int]) -> None:
    torch.manual_seed(1)
    hidden = torch.randn(sum(seqlens), 384) * 3
    cu = np.concatenate([[0], np.cumsum(seqlens)]).astype(np.int32)
    seq_ids = torch.from_numpy(np.repeat(np.arange(len(seqlens)), seqlens))
    ours = pool_host(hidden.numpy(), cu, method)  # type: ignore[arg-type]
    reference = pool(hidden, torch.from_numpy(cu), seq_ids, method)  # type: ignore[arg-type]
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, reference.numpy())
