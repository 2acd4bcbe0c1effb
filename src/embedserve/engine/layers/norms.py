"""The norms' parameters. The computations are the ops table's (`ops.rms_norm`,
`ops.add_layer_norm_residual`, `ops.gemma_*`), called by the layer that owns a norm, fused with
the residual add where there is one; these modules only hold the weights (and eps) under the
names the checkpoints are mapped to."""

from __future__ import annotations

import torch
from torch import nn


class Norm(nn.Module):
    """A LayerNorm's parameters (bias optional)."""

    def __init__(self, dim: int, eps: float, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.eps = eps


class RMSNorm(nn.Module):
    """An RMSNorm's scale (Hugging Face's order of operations: `ops.rms_norm`)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps


class GemmaNorm(nn.Module):
    """A Gemma RMSNorm's weight: the scale is 1 + weight (`ops.gemma_rms_norm`)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps
