"""A batch above the CUDA graphs' bucket grid, run as parts the buckets hold.

`buckets.grid_parts` cuts the batch into runs of sequences, in order; each part replays its
bucket's graph, and a sequence longer than the largest bucket runs eagerly alone. So no batch runs
eagerly at more tokens than the grid's, and attention's buffers stay bounded by them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from embedserve.engine.attention import AttentionFn
from embedserve.engine.batch import PackedBatch
from embedserve.engine.buckets import grid_parts
from embedserve.engine.eager import eager_run
from embedserve.engine.graphs import GraphRunner


def run_parts(
    batch: PackedBatch,
    runner: GraphRunner,
    forward: Callable[..., torch.Tensor],  # the runner's module, for a part no bucket holds
    attend: AttentionFn,
) -> torch.Tensor:
    """The batch's rows, [S, width] (a per-token runner: [T, H]), on the runner's device; the
    runner's counters count the split and each eager part."""
    out: torch.Tensor | None = None
    cu, stats = batch.cu_seqlens, runner.stats
    for start, stop in grid_parts(batch.seqlens, runner.config, runner.max_positions):
        part = batch.sequences(start, stop)
        rows = runner.run(part)
        if rows is None:
            stats.eager_runs += 1  # above the largest bucket
            rows = eager_run(forward, part, runner.device, attend)
        if out is None:
            total = batch.num_tokens if runner.per_token else batch.num_seqs
            out = rows.new_empty((total, *rows.shape[1:]))
        a, b = (int(cu[start]), int(cu[stop])) if runner.per_token else (start, stop)
        # NOTE: copied before the next part: a bucket's output is rewritten by its next run
        out[a:b].copy_(rows)
    stats.split_batches += 1
    assert out is not None
    return out
