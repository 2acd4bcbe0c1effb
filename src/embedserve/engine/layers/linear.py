"""The models' linear layer: y = x W^T + b through the ops table the model was built with.

Its parameters are named and shaped as `nn.Linear`'s (`weight` [out, in], `bias` [out]), so the
state-dict keys a checkpoint is loaded into are unchanged. On CUDA `ops.linear` picks, per shape,
between cuBLAS and the small-M Triton kernel (`kernels.tuning.small_m_linear`).
"""

from __future__ import annotations

import torch
from torch import nn

from embedserve.engine.ops import Ops


class Linear(nn.Module):
    """Its values come from the checkpoint (models are built on the meta device, then loaded)."""

    def __init__(self, in_features: int, out_features: int, ops: Ops, *, bias: bool = True) -> None:
        super().__init__()
        self.ops = ops
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias: nn.Parameter | None = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        return self.ops.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"
