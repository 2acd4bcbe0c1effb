"""The sentence-transformers Dense modules after pooling (EmbeddingGemma's 768 -> 3072 -> 768):
float32 on the device, inside the CUDA graph, between pooling and the per-request head."""

from __future__ import annotations

from torch import nn

from embedserve.engine.weights import FolderWeights
from embedserve.loading.spec import ModelLoadError, ModelSpec


def build_dense(spec: ModelSpec, weights: FolderWeights | None = None) -> nn.Module | None:
    """The folder's Dense modules as one float32 module on the CPU, or None when it has none;
    read through `weights` (by default a reader of its own)."""
    if not spec.dense:
        return None
    weights = weights or FolderWeights(spec)
    layers: list[nn.Module] = []
    for layer in spec.dense:
        folder = spec.path / layer.path
        tensors = weights.dense(layer.path)
        linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
        state = {"weight": tensors.get("linear.weight")}
        if layer.bias:
            state["bias"] = tensors.get("linear.bias")
        for name, t in state.items():
            want = (
                (layer.out_features, layer.in_features)
                if name == "weight"
                else (layer.out_features,)
            )
            if t is None or tuple(t.shape) != want:
                got = "missing" if t is None else f"shape {list(t.shape)}"
                raise ModelLoadError(
                    f"{folder}: tensor 'linear.{name}' {got}, expected shape {list(want)}"
                )
        linear.load_state_dict({k: v.float() for k, v in state.items() if v is not None})
        layers.append(linear)
        if layer.activation == "tanh":
            layers.append(nn.Tanh())
    return nn.Sequential(*layers).eval()
