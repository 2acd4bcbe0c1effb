"""Where and in what precision an engine runs: the device asked for, the dtype (a CPU's default
and its float32 executors' names checked here)."""

from __future__ import annotations

import torch

from embedserve.engine.cpu import default_dtype
from embedserve.engine.cpu_paths import PATHS as CPU_PATHS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but no CUDA device is available")
    return dev


def resolve_dtype(
    device: torch.device, dtype: str | None, cpu_path: str | None
) -> tuple[str, bool]:
    """The dtype's name an engine runs in, and whether a CPU executor was named (`cpu_path`:
    float32 on a CPU only)."""
    asked_path = cpu_path not in (None, "auto")
    if asked_path and cpu_path not in CPU_PATHS:
        raise ValueError(f"cpu_path {cpu_path!r} is not one of auto, {', '.join(CPU_PATHS)}")
    if asked_path and (device.type != "cpu" or dtype not in (None, "float32")):
        raise ValueError(f"cpu_path {cpu_path!r} is a float32 CPU executor: not on "
                         f"{device.type} with dtype {dtype!r}")  # fmt: skip
    dtype_name = dtype or ("float32" if asked_path else default_dtype(device))
    if dtype_name not in DTYPES:
        raise ValueError(f"dtype {dtype_name!r} is not one of {', '.join(DTYPES)}")
    return dtype_name, asked_path
