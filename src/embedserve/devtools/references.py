"""The reference libraries of the sparse and multi-vector outputs, loaded as the parity tests,
the Qdrant test and the retrieval benchmark use them (one loader each, so they compare against
the same code)."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any


def flag_m3_embedder() -> Any:
    """FlagEmbedding's BGEM3FlagModel class (M3Embedder). NOTE: FlagEmbedding 1.4.2's package
    __init__ imports every model, one of them (MiniCPM's reranker) a transformers 4 module, so
    the m3 module is imported without the package __init__s. ModuleNotFoundError when
    FlagEmbedding is not installed."""
    package = sys.modules.get("FlagEmbedding")
    if package is not None and getattr(package, "__path__", None):
        # loaded before (by this function: a module without a spec, which find_spec refuses)
        root = next(iter(package.__path__))
    else:
        spec = importlib.util.find_spec("FlagEmbedding")
        if spec is None:
            raise ModuleNotFoundError("FlagEmbedding is not installed", name="FlagEmbedding")
        root = next(iter(spec.submodule_search_locations or []))
    for name in (
        "FlagEmbedding",
        "FlagEmbedding.inference",
        "FlagEmbedding.inference.embedder",
        "FlagEmbedding.inference.embedder.encoder_only",
    ):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, *name.split(".")[1:])]
            sys.modules[name] = package
    from FlagEmbedding.inference.embedder.encoder_only.m3 import M3Embedder

    return M3Embedder
