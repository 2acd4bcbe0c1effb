"""The kernel choices an engine measured on its device, in one object the engine owns.

The `Engine` creates one `KernelChoices` and hands it to what picks a kernel: the ops table's
linear (GEMM kernel per shape), the cuDNN attention backend (whether it takes grouped K/V heads)
and the `GraphRunner` (attention backend per bucket). Each entry is learned the first time its
shape is seen, never inside a CUDA-graph capture, and kept for the engine's life. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class KernelChoices:
    """Mutated only by the engine's own thread, as `EngineStats` is; the timings behind each
    choice are in `EngineStats` (`attention_timings`, `gemm_timings`)."""

    # bucket key -> the attention backend its graph was captured with (fastest at capture)
    attention: dict[str, str] = field(default_factory=dict)
    # (device, dtype, M, N, K, has bias) -> the small-M Triton config measured faster than
    # cuBLAS for that exact GEMM, or None: cuBLAS
    gemm: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    # whether cuDNN's SDPA takes grouped K/V heads (`enable_gqa`); None until first tried
    cudnn_gqa: bool | None = None
