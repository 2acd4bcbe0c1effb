"""Timing on the host and the one percentile function every benchmark reports with.

`percentile` is numpy's linear interpolation (what every script used before it was shared), so
figures already committed and new ones are computed the same way.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np


def percentile(values: Iterable[float], q: float) -> float:
    """The `q`-th percentile (0-100) of `values`, linear interpolation; NaN when empty."""
    xs = np.asarray(list(values), dtype=np.float64)
    return float(np.percentile(xs, q)) if xs.size else float("nan")


def median(values: Iterable[float]) -> float:
    return float(statistics.median(values))


def latency_ms(seconds: Iterable[float]) -> dict[str, float]:
    """p50 and p99 in milliseconds of latencies given in seconds."""
    ms = [x * 1000 for x in seconds]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}


def timed_ms(fn: Callable[[], Any], reps: int, device: str, warm: int = 2) -> list[float]:
    """`reps` timed calls of `fn` after `warm` untimed ones; on "cuda" the device is synchronized
    before and after each, so a call's time includes its GPU work."""
    sync = _sync(device)
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def timed_s(fn: Callable[[], Any], reps: int) -> list[float]:
    """`reps` timed calls of `fn` in seconds, host time only, no warm-up (the caller's)."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _sync(device: str) -> Callable[[], None]:
    if device != "cuda":
        return lambda: None
    import torch

    return torch.cuda.synchronize
