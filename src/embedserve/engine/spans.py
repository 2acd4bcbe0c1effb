"""Late chunking's pooling: one mean-pooled vector per token span of the hidden states.

A span is `[start, end)` in the packed token dimension of the batch (so it lies inside one
sequence). Spans may overlap (a token straddling two chunks belongs to both). The forward over
whole documents is the engine's (`Engine.embed_spans`); these are pure functions of its output.
"""

from __future__ import annotations

import numpy as np
import torch

from embedserve.engine.batch import PackedBatch


def pool_spans(
    hidden: torch.Tensor,  # [T, H]
    spans: torch.Tensor,  # [K, 2] int64: [start, end) token indices, end > start
) -> torch.Tensor:  # [K, H] float32
    lengths = spans[:, 1] - spans[:, 0]  # [K]
    span_ids = torch.repeat_interleave(torch.arange(spans.shape[0], device=hidden.device), lengths)
    # token index of each (span, token) pair: start of its span + offset inside it
    first = torch.repeat_interleave(spans[:, 0], lengths)
    offsets = torch.arange(span_ids.shape[0], device=hidden.device) - torch.repeat_interleave(
        torch.cumsum(lengths, 0) - lengths, lengths
    )
    sums = torch.zeros(spans.shape[0], hidden.shape[1], dtype=torch.float32, device=hidden.device)
    # NOTE: fp32 accumulation whatever the model dtype, as in `pooling.pool`
    sums.index_add_(0, span_ids, hidden[first + offsets].float())
    return sums / lengths[:, None].to(torch.float32)


def check_spans(spans: np.ndarray, batch: PackedBatch) -> np.ndarray:
    """[K, 2] int64 spans, each non-empty and inside one sequence of the batch."""
    spans = np.ascontiguousarray(spans, dtype=np.int64)
    if spans.ndim != 2 or spans.shape[1] != 2 or spans.shape[0] == 0:
        raise ValueError("spans must be a non-empty [num_spans, 2] array of [start, end)")
    starts, ends = spans[:, 0], spans[:, 1]
    if (ends <= starts).any() or starts.min() < 0 or ends.max() > batch.num_tokens:
        raise ValueError(f"every span must be non-empty and within [0, {batch.num_tokens})")
    seq_of_start = batch.seq_ids[starts]
    if (batch.seq_ids[ends - 1] != seq_of_start).any():
        raise ValueError("a span must not cross a sequence boundary")
    return spans
