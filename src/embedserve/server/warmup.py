"""What a server does to its engine before it says ready, so that its first clients and its small
ones do not pay for it: on a GPU the CUDA graphs of short queries captured (`warm_up_graphs`), on
the CPU the batch budget measured (`measured_batch_tokens`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from embedserve.processes import say

# Batches of up to this many short queries find their CUDA graphs captured at start-up: 46
# buckets, one query from each of 64 clients in one batch.
WARMUP_QUERIES = 64
# On the CPU a query that arrives while a batch runs waits for that batch (a batch in flight is
# never cut): a batch holds what this CPU runs in this long, measured at start-up. A quiet 2-core
# AVX2 Zen 3 in float32 (ONNX Runtime) ran 5,400 tokens/s (1,024 tokens), 256 under a load of ~5.
CPU_BATCH_SECONDS = 0.25
CPU_MIN_BATCH_TOKENS = 256
# the batch timed: four sequences of 128 tokens, the shape of a large request's part
PROBE_SEQS, PROBE_TOKENS = 4, 128
# timings taken again while other processes hold the cores, each after a pause
CONTENDED_RETRIES, CONTENDED_PAUSE_S = 2, 1.0


def warm_up_graphs(engine: Any, max_queries: int) -> int:
    """On a GPU, the graphs of batches of up to `max_queries` short queries, each bucket taken
    through its first two steps now (`buckets.short_query_batches`): a first hit is an eager run
    with its kernel timings, a second the capture with its attention timings, tenths of a second
    a first client would otherwise wait. Returns the buckets warmed (0 without graphs)."""
    from embedserve.engine.batch import PackedBatch
    from embedserve.engine.buckets import short_query_batches

    if engine.runner is None or max_queries == 0:
        return 0
    start = time.perf_counter()
    batches = short_query_batches(max_queries, engine.runner.config, engine.max_positions)
    for seqlens in batches:
        batch = PackedBatch.from_packed(np.full(int(seqlens.sum()), 100, np.int64), seqlens)
        for _ in range(2):
            engine.step(batch).wait()
    say(
        f"embedserve server: graphs of {len(batches)} buckets (batches of up to {max_queries} "
        f"short queries) warmed in {time.perf_counter() - start:.1f} s"
    )
    return len(batches)


def measured_batch_tokens(engine: Any) -> int | None:
    """On the CPU, the batch budget: the tokens this CPU runs in `CPU_BATCH_SECONDS` (the best of
    three timed steps of a `PROBE_SEQS` x `PROBE_TOKENS` batch), rounded down to a power of two,
    between `CPU_MIN_BATCH_TOKENS` and the engine's own budget. None on a GPU (its graphs' budget
    stands: a batch there takes milliseconds)."""
    from embedserve.engine.batch import PackedBatch

    if engine.device.type != "cpu":
        return None
    seqlens = np.full(PROBE_SEQS, min(PROBE_TOKENS, engine.max_positions))
    batch = PackedBatch.from_packed(np.full(int(seqlens.sum()), 100, np.int64), seqlens)
    from embedserve.engine.cpu_timing import Neighbours

    engine.step(batch).wait()  # the first step of this shape warms caches and allocators
    best = float("inf")
    # NOTE: timed again, after a pause, while other processes hold the cores (two servers
    # starting at once timed each other's forwards and kept 512-token batches for 2,048)
    for attempt in range(CONTENDED_RETRIES + 1):
        if attempt:
            time.sleep(CONTENDED_PAUSE_S)
        with Neighbours() as neighbours:
            for _ in range(3):
                start = time.perf_counter()
                engine.step(batch).wait()
                best = min(best, time.perf_counter() - start)
        if not neighbours.contended:
            break
    rate = batch.num_tokens / best
    fits = max(CPU_MIN_BATCH_TOKENS, int(rate * CPU_BATCH_SECONDS))
    budget = min(engine.batch_tokens, 1 << (fits.bit_length() - 1))
    busy = (
        f"; other processes kept {neighbours.cores:.1f} cores busy meanwhile: the budget may be "
        "low (set --max-batch-tokens to fix it)"
        if neighbours.contended
        else ""
    )
    say(
        f"embedserve server: batches of up to {budget} tokens (this CPU ran {rate:,.0f} "
        f"tokens/s at start-up; a query waits for at most one batch, ~{CPU_BATCH_SECONDS} s"
        f"{busy})"
    )
    return budget
