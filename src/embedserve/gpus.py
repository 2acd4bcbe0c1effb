"""The CUDA devices this process may use, counted without importing torch where no NVIDIA driver
is loaded (importing torch costs a launcher a second or two on a CPU machine). Its own module, so
that what imports it (the launcher, an index job's driver) is all that may import torch here: no
gateway does."""

from __future__ import annotations

import os


def visible_gpus() -> int:
    """CUDA devices this process may use; 0 on a machine with no NVIDIA driver loaded."""
    if not os.path.exists("/dev/nvidiactl") and not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return 0
    import torch

    return int(torch.cuda.device_count())
