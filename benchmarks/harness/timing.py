"""Timing a call on the host: milliseconds per call, the GPU synchronized around each."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def timed_ms(fn: Callable[[], Any], reps: int, device: str, warm: int = 2) -> list[float]:
    """`reps` timed calls of `fn` after `warm` untimed ones; on "cuda" the device is synchronized
    before and after each, so a call's time includes its GPU work."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
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
