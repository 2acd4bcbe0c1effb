"""The CPU's default precision: bfloat16 where the cores multiply it natively, float32 elsewhere.

Measured on the 2-core Xeon that runs this project's CPU suites (AVX-512 BF16 and AMX),
all-MiniLM-L6-v2 real weights (issue 25): bf16 ran one short query in 5.8 ms against fp32's
9.7 ms and 1,000 passages at 44.4/s against 22.1/s, at cosine 0.99994 to sentence-transformers
fp32. The win is half the weight bytes read per forward and oneDNN's bf16 GEMMs; without native
bf16 the same dtype is emulated and slower than fp32, so such a CPU keeps fp32.

The choice is checked at start-up by the engine's fidelity guard against the eager fp32
reference, and falls back to fp32 when the guard finds it too far (`Engine`). A CPU whose default
is fp32 runs the fastest float32 executor measured at start-up (`cpu_paths`: ONNX Runtime,
oneDNN prepacked weights, or eager).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

# /proc/cpuinfo flags of a native bf16 dot product: AVX-512 BF16 (VDPBF16PS) or AMX tiles
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags; empty where there is no /proc/cpuinfo (macOS)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively, so bf16 is its default dtype.

    Both must hold: the kernel reports AVX-512 BF16 or AMX-BF16 (`/proc/cpuinfo`), and PyTorch's
    oneDNN build can use them (`torch.ops.mkldnn._is_mkldnn_bf16_supported()`, which also
    needs the AVX-512 dispatch that `torch.backends.cpu.get_cpu_capability()` names): a flag
    that torch cannot use would mean emulated bf16, slower than fp32. ARM CPUs (no such flags
    here) keep fp32 until measured."""
    if not BF16_FLAGS & _cpu_flags():
        return False
    if not torch.backends.cpu.get_cpu_capability().startswith(("AVX512", "AMX")):
        return False
    return bool(
        torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def default_dtype(device: torch.device) -> str:
    """The dtype an engine runs when none is asked for: bf16 on CUDA and on a native-bf16 CPU."""
    if device.type == "cuda" or native_bf16():
        return "bfloat16"
    return "float32"
