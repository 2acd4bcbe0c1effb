"""Where a request's time goes inside the server, stage by stage, as histograms.

Observed on the hot path (a lock and a bisect: well under a microsecond) and exported by
`server/metrics.py` as `embedserve_server_stage_seconds{stage=...}`, so an operator sees the same
breakdown the benchmarks report (`benchmarks/breakdown.py` reads it from there):

| stage   | from → to                                                                         |
|---------|-----------------------------------------------------------------------------------|
| queue   | checked and queued → taken into a batch (an idle engine: the wake-up of its thread) |
| launch  | `Engine.step()` on the host: pad, stage, launch the graph (the CPU: the forward)    |
| device  | `step()` returned → pooled rows on the host (the device's remaining work + copy)    |
| encode  | each request's head applied and its answer built                                  |
| deliver | answers posted by a worker thread → delivered on the event loop (one wake-up)     |

`queue` is per request, the others per batch.
"""

from __future__ import annotations

import bisect
import threading

STAGES = ("queue", "launch", "device", "encode", "deliver")
# upper bounds in seconds: microseconds for the GPU's host path, up to seconds for CPU batches
BUCKETS = (
    5e-6, 1e-5, 2e-5, 3e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4, 7.5e-4,
    1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip


class StageTimes:
    """Per stage: counts per bucket (the last one is +Inf), the sum, the number observed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # observed from the loop and from two worker threads
        self.counts = {stage: [0] * (len(BUCKETS) + 1) for stage in STAGES}
        self.sums = dict.fromkeys(STAGES, 0.0)

    def observe(self, stage: str, seconds: float) -> None:
        i = bisect.bisect_left(BUCKETS, seconds)
        with self._lock:
            self.counts[stage][i] += 1
            self.sums[stage] += seconds

    def snapshot(self) -> dict[str, tuple[list[int], float]]:
        """Per stage: cumulative counts at each bucket bound (+Inf last) and the sum."""
        with self._lock:
            out = {}
            for stage in STAGES:
                cumulative, total = [], 0
                for count in self.counts[stage]:
                    total += count
                    cumulative.append(total)
                out[stage] = (cumulative, self.sums[stage])
            return out
