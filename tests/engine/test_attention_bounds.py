"""Memory bounded by design: the largest buffer each attention backend builds, recorded op by op,
against the bound computed from the batch's tokens; the same outputs as the unbounded forms.

Bound (elements; T tokens of the batch, L its longest row, N heads, D head dim): `padded` and
everything it stands in for stay within `masks.padded_bound` = N * 2 max(T, L) * max(L, D); a
[T, T] mask (block_mask, cudnn over several sequences) is built only up to
`masks.MAX_MASK_TOKENS` tokens (N * T² with a score bias). `Engine.step` splits a batch above
the bucket grid, so T is at most the grid's largest bucket (8,192 tokens): for MPNet on CUDA
(N 12, D 64, L <= 512) at most 100.7M elements (201 MB in bf16) per buffer, where the unbounded
`padded` built a 9.2 GB mask for one 384-token text among 2,600 three-token ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from embedserve.engine.attention import MASKED, RaggedLayout, attention_backends, masks
from embedserve.engine.attention.layout import Scope
from embedserve.engine.attention.sdpa import expand_kv
from embedserve.engine.batch import PackedBatch
from embedserve.engine.buckets import plan_bucket, stage_inputs
from embedserve.engine.choices import KernelChoices
from embedserve.engine.graphs import GraphConfig

HEADS, KV_HEADS, DIM, REACH = 4, 2, 16, 128
BACKENDS = attention_backends(KernelChoices())
CPU_BACKENDS = ("sdpa_loop", "block_mask", "padded", "cudnn")


class Largest(TorchDispatchMode):
    """The largest tensor any op returns while active (masks, gathers, scores, outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel, self.shape = 0, ()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                self.numel, self.shape = t.numel(), tuple(t.shape)
        return out


def bound(backend: str, t: int, length: int) -> int:
    square = HEADS * t * t if backend in MASKED and t <= masks.MAX_MASK_TOKENS else 0
    return max(square, masks.padded_bound(t, length, HEADS, DIM))


def eager_layout(seqlens: list[int]) -> RaggedLayout:
    cu = torch.tensor(np.concatenate([[0], np.cumsum(seqlens)]), dtype=torch.int32)
    return RaggedLayout(cu, max(seqlens), tuple(seqlens))


def graph_layout(seqlens: list[int], max_positions: int) -> tuple[RaggedLayout, int, int]:
    """The layout a CUDA graph runs for this batch: its bucket's, padded, no host lengths."""
    batch = PackedBatch.from_packed(np.zeros(sum(seqlens), np.int64), np.array(seqlens))
    plan = plan_bucket(batch.seqlens, GraphConfig(), max_positions)
    assert plan is not None
    staged = np.empty(plan.staged_size, np.int64)
    stage_inputs(batch, plan, staged)
    t = plan.num_tokens
    seq_ids = torch.from_numpy(staged[3 * t : 4 * t])
    cu = torch.from_numpy(staged[4 * t :]).to(torch.int32)
    layout = RaggedLayout(cu, plan.max_seqlen, (), seq_ids, dense=plan.dense, solo=plan.solo)
    return layout, t, sum(seqlens)


def qkv(t: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(t, n, DIM, generator=g) for n in (HEADS, KV_HEADS, KV_HEADS))


def score_bias(seed: int = 1) -> torch.Tensor:
    return torch.randn(HEADS, 2 * REACH + 1, generator=torch.Generator().manual_seed(seed))


def unbounded_padded(q: Any, k: Any, v: Any, layout: RaggedLayout, bias: Any) -> torch.Tensor:
    """The form `padded` had: every sequence in one [S, L] gather, one [S, N, L, L] mask."""
    t, length = q.shape[0], layout.max_seqlen
    cu = layout.cu_seqlens.long()
    starts, lens = cu[:-1], cu[1:] - cu[:-1]
    offsets = torch.arange(length)
    rows = (starts[:, None] + offsets[None, :]).clamp_max(t - 1)
    keep = (offsets[None, :] < lens[:, None])[:, None, None, :]
    mask = keep if bias is None else masks.additive(keep, bias, length, q.dtype, q.device)
    k, v = expand_kv(k, HEADS), expand_kv(v, HEADS)
    out = F.scaled_dot_product_attention(*(x[rows].transpose(1, 2) for x in (q, k, v)), mask)
    seq_ids = layout.seq_ids
    if seq_ids is None:
        seq_ids = torch.repeat_interleave(torch.arange(len(layout.seqlens)), lens)
    return out.transpose(1, 2)[seq_ids, torch.arange(t) - starts[seq_ids]]


def unbounded_square(q: Any, k: Any, v: Any, layout: RaggedLayout, bias: Any) -> torch.Tensor:
    """The [T, T] form block_mask keeps up to MAX_MASK_TOKENS and had above it."""
    scope = Scope(layout, False, None, bias, KernelChoices())
    mask = masks.block_diagonal(scope, q.shape[0], q.dtype, q.device)
    k, v = expand_kv(k, HEADS), expand_kv(v, HEADS)
    out = F.scaled_dot_product_attention(*(x[None].transpose(1, 2) for x in (q, k, v)), mask)
    return out[0].transpose(0, 1)


# one long text among many short ones (the case, scaled to a CPU), many 1-token inputs,
# and a batch above MAX_MASK_TOKENS
EAGER_CASES = {
    "long-among-short": [128] + [3] * 600,
    "one-token-ids": [1] * 2000,
    "above-mask-limit": [50] * 50,
}


@torch.inference_mode()
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", list(EAGER_CASES))
@pytest.mark.parametrize("with_bias", [True, False])
def test_eager_attention_buffers_stay_within_the_bound(
    backend: str, case: str, with_bias: bool
) -> None:
    seqlens = EAGER_CASES[case]
    t = sum(seqlens)
    q, k, v = qkv(t)
    bias = score_bias() if with_bias else None
    layout = eager_layout(seqlens)
    with Largest() as seen:
        got = BACKENDS[backend](q, k, v, layout, False, None, bias)
    assert seen.numel <= bound(backend, t, max(seqlens)), (seen.shape, bound(backend, t, 0))
    # the same numbers as before: the unbounded forms, and one SDPA per sequence
    want = BACKENDS["sdpa_loop"](q, k, v, eager_layout(seqlens), False, None, bias)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    if backend == "padded":
        old = unbounded_padded(q, k, v, eager_layout(seqlens), bias)
        torch.testing.assert_close(got, old, atol=2e-6, rtol=1e-5)
    if backend == "block_mask":
        old = unbounded_square(q, k, v, eager_layout(seqlens), bias)
        torch.testing.assert_close(got, old, atol=2e-6, rtol=1e-5)


@torch.inference_mode()
@pytest.mark.parametrize("backend", ("block_mask", "padded", "cudnn"))
@pytest.mark.parametrize("with_bias", [True, False])
def test_graph_bucket_attention_buffers_stay_within_the_bound(
    backend: str, with_bias: bool
) -> None:
    """A bucket of 256 tokens and 128 sequences, rows 128 long: the unbounded `padded` gathered
    128 x 128 slots for 200 real tokens."""
    layout, t, real = graph_layout([100] + [1] * 100, max_positions=128)
    assert (t, layout.max_seqlen, layout.cu_seqlens.numel() - 1) == (256, 128, 128)
    q, k, v = qkv(t, seed=3)
    bias = score_bias(4) if with_bias else None
    with Largest() as seen:
        got = BACKENDS[backend](q, k, v, layout, False, None, bias)
    assert seen.numel <= bound(backend, t, layout.max_seqlen), seen.shape
    old = unbounded_padded(q, k, v, layout, bias)
    torch.testing.assert_close(got[:real], old[:real], atol=2e-6, rtol=1e-5)


@torch.inference_mode()
def test_padded_with_a_window_and_causal_equals_per_sequence() -> None:
    seqlens = [40] + [2] * 300 + [17]
    q, k, v = qkv(sum(seqlens), seed=5)
    for causal, window in ((True, None), (False, 8), (True, 8)):
        got = BACKENDS["padded"](q, k, v, eager_layout(seqlens), causal, window)
        want = BACKENDS["sdpa_loop"](q, k, v, eager_layout(seqlens), causal, window)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_the_stated_figures() -> None:
    """MPNet on CUDA at the grid's largest bucket: the bound is 100.7M elements."""
    assert masks.padded_bound(8192, 512, 12, 64) == 100_663_296
    # the unbounded mask of the issue: 2,601 rows of 384 slots, 12 heads, bf16
    assert 2601 * 12 * 384 * 384 * 2 > 9.2e9
