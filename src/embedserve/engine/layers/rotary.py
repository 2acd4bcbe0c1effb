"""Rotary angles from each token's position in its own sequence (packed sequences each start at
0), computed in float32 as Hugging Face does and cast to the model dtype."""

from __future__ import annotations

import torch


class Rotary:
    """cos / sin tables [T, 1, D] for one base (theta) and head dim. Not a module: the inverse
    frequencies must stay float32 when the model is cast to bf16 (one copy per device)."""

    def __init__(self, theta: float, head_dim: int) -> None:
        self.theta, self.head_dim = theta, head_dim
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:  # [D / 2] float32
        if device not in self._inv_freq:
            d = self.head_dim
            exponents = torch.arange(0, d, 2, dtype=torch.int64).float() / d
            self._inv_freq[device] = (1.0 / (self.theta**exponents)).to(device)
        return self._inv_freq[device]

    def __call__(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq(positions.device)[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, D]
        return angles.cos().to(dtype), angles.sin().to(dtype)
