"""Pooling: one vector per sequence from the packed hidden states.

Pooling is a *method* (mean, CLS, last token) applied here on the device; the *head* (truncate to
requested dimensions, normalize, quantize) is applied per request in `outputs`.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from embedserve.loading.spec import PoolingMethod


def pool(
    hidden: torch.Tensor,  # [T, H]
    cu_seqlens: torch.Tensor,  # [S + 1] int32
    seq_ids: torch.Tensor,  # [T] int64: which sequence each token belongs to
    method: PoolingMethod,
) -> torch.Tensor:  # [S, H] float32
    num_seqs = cu_seqlens.shape[0] - 1
    if method == "cls":
        # NOTE: a CUDA graph's bucket ends in empty sequences that start at T; clamp so their
        # (never returned) row reads a real token instead of indexing past the end.
        return hidden[cu_seqlens[:-1].long().clamp_max(hidden.shape[0] - 1)].float()
    if method == "last":
        return hidden[cu_seqlens[1:].long() - 1].float()
    # NOTE: accumulate in fp32 whatever the model dtype: a bf16 sum over hundreds of tokens
    # loses the low bits that separate near neighbours.
    sums = torch.zeros(num_seqs, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, seq_ids, hidden.float())
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).clamp_min(1).to(torch.float32)
    return sums / lengths[:, None]


def pool_host(
    hidden: np.ndarray,  # [T, H] float32
    cu_seqlens: np.ndarray,  # [S + 1] int32, no empty sequence
    method: PoolingMethod,
) -> np.ndarray:  # [S, H] float32
    """`pool` in NumPy, for an executor whose rows are NumPy's (ONNX Runtime): the same bits, each
    sequence's rows added in order in float32 and divided by its length."""
    if method == "cls":
        return hidden[cu_seqlens[:-1]]
    if method == "last":
        return hidden[cu_seqlens[1:] - 1]
    # NOTE: a sum over axis 0 adds the rows in order, as torch's index_add_ does (add.reduceat
    # does not: its bits differ)
    bounds = cu_seqlens.tolist()
    sums = np.empty((len(bounds) - 1, hidden.shape[1]), dtype=np.float32)
    for i, (start, end) in enumerate(itertools.pairwise(bounds)):
        hidden[start:end].sum(axis=0, out=sums[i])
    return sums / np.diff(cu_seqlens).astype(np.float32)[:, None]
