"""Late chunking's pooling: one mean-pooled vector per token span of the hidden states.

A span is `[start, end)` in the packed token dimension of the batch (so it lies inside one
sequence). Spans may overlap (a token straddling two chunks belongs to both). The forward over
whole documents is the engine's (`Engine.embed_spans`); these are pure functions of its output.
"""

from __future__ import annotations

import torch


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
