"""Late chunking: one forward over whole documents, then one mean-pooled vector per token span.

A span is `[start, end)` in the packed token dimension of the batch (so it lies inside one
sequence). Spans may overlap (a token straddling two chunks belongs to both). This runs eagerly,
outside the CUDA-graph path of `Engine.step`: documents are long and few, so launches do not
dominate.
"""

from __future__ import annotations

import numpy as np
import torch

from embedserve.engine.attention import RaggedLayout
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine


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


@torch.inference_mode()
def embed_spans(engine: Engine, batch: PackedBatch, spans: np.ndarray) -> np.ndarray:
    """Run `batch` through the engine's model and mean-pool each span: [K, H] float32."""
    engine.check(batch)
    spans = check_spans(spans, batch)
    dev = engine.device

    def to_dev(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(dev, non_blocking=True)

    layout = RaggedLayout(to_dev(batch.cu_seqlens), batch.max_seqlen, tuple(batch.seqlens.tolist()))
    hidden = engine.model(
        to_dev(batch.input_ids),
        to_dev(batch.positions),
        to_dev(batch.token_type_ids),
        layout,
        engine.attend,
    )
    return pool_spans(hidden, to_dev(spans)).cpu().numpy()
