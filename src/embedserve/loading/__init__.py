"""Reading a model folder: its spec, the family registry, the bundled model, Hub ids. No torch."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """embedserve's folder of the user's cache ($XDG_CACHE_HOME, else ~/.cache): what is derived
    from a model folder and kept across runs (layout views, ONNX graphs, the CPU path choices)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "embedserve"
