"""Counters the engine keeps about its fast path, for metrics and benchmarks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EngineStats:
    """Mutated only by the engine's own thread; read by anyone (a snapshot is `as_dict()`)."""

    captures: int = 0  # CUDA graphs captured (one per bucket, the second time it is hit)
    replays: int = 0  # steps served by replaying a captured graph
    # steps run without a graph: a bucket's first hit, above the largest, or (CUDA) outputs whose
    # attention keys are cut short (`Engine.encode_outputs`'s visible_keys)
    eager_runs: int = 0
    # batches above the bucket grid, split into parts that buckets hold (`Engine.step`)
    split_batches: int = 0
    # buckets whose graph capture failed (each then runs eagerly, and is never captured again)
    capture_failures: int = 0
    capture_seconds: float = 0.0  # host seconds spent capturing (warm-up run + capture + tuning)
    first_run_seconds: float = 0.0  # host seconds of buckets' first (eager) hits
    compiles: int = 0  # torch.compile compilations of the fused ops
    compile_seconds: float = 0.0  # host seconds of the calls that compiled
    real_tokens: int = 0  # tokens of real sequences run through a bucket
    padding_tokens: int = 0  # tokens added to reach a bucket (the padding waste)
    # bucket key -> {attention backend: replay ms}, measured when the bucket was captured
    attention_timings: dict[str, dict[str, float]] = field(default_factory=dict)
    # bucket key -> {attention backend: why it was dropped (failed to run, or disagreed)}
    attention_errors: dict[str, dict[str, str]] = field(default_factory=dict)
    # "MxNxK" -> {"cublas": us, best Triton config: us, "chosen": ...}: small-M GEMMs timed once
    gemm_timings: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
