"""Attention over a packed ragged batch: one signature the models call (`layout`), one mask
builder (`masks`), the kernels (`sdpa`, `cudnn`, `flash`) and one record per backend
(`backends`), from which a model's backends are chosen."""

from embedserve.engine.attention.backends import (
    BACKEND_NAMES,
    BACKENDS,
    CAPTURE_SAFE,
    MASKED,
    Backend,
    attention_backends,
    choose_backend,
    graph_candidates,
    model_backend,
)
from embedserve.engine.attention.layout import AttentionFn, RaggedLayout, Scope
from embedserve.engine.attention.masks import distance_bias

__all__ = [
    "BACKENDS",
    "BACKEND_NAMES",
    "CAPTURE_SAFE",
    "MASKED",
    "AttentionFn",
    "Backend",
    "RaggedLayout",
    "Scope",
    "attention_backends",
    "choose_backend",
    "distance_bias",
    "graph_candidates",
    "model_backend",
]
