"""What attention is given besides q, k, v: where each packed sequence starts and ends, and what a
layer asks of it (causal, a window, a score bias), behind the one signature the models call.

Every backend takes q, k, v as [T, N, D] (T = tokens of all sequences back to back) and the
sequence boundaries in a `RaggedLayout`; none pads sequences to a common length.

`window`: None (every key of the sequence), or a sliding window, the largest distance
|query - key| a query may attend over (ModernBERT's local layers: 64; a bidirectional Gemma3's
sliding layers: `sliding_window // 2`). Within one packed sequence the distance of positions is
the distance of token indices, so the window is a band on the packed dimension intersected with
the sequence's block.

`bias`: None, or a per-head additive score bias by distance (MPNet's relative positions):
[N, 2R + 1], the entry for key - query distance d at column clamp(d, -R, R) + R.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from embedserve.engine.choices import KernelChoices


@dataclass(frozen=True)
class RaggedLayout:
    """Where each sequence starts and ends in the packed token dimension."""

    cu_seqlens: torch.Tensor  # [S + 1] int32, on the model's device
    max_seqlen: int
    seqlens: tuple[int, ...]  # host copy, for backends that loop over sequences
    # [T] int64 on the device: set inside CUDA graphs, where no host value may change between
    # replays (then `seqlens` is empty and `max_seqlen` is the bucket's bound, not the batch's)
    seq_ids: torch.Tensor | None = None
    # exactly one sequence covering all T tokens (no padding): attention needs no mask
    dense: bool = False
    # [T, T] bool block-diagonal mask, where the caller has it already (else `masks` builds it
    # from `seq_ids` once per forward)
    mask: torch.Tensor | None = None
    # the masks of this forward, built once by `masks` on first use and reused by every layer
    cache: dict[Hashable, Any] = field(default_factory=dict, compare=False)
    # exactly one real sequence, at the front (sequence 0), the rest padding; `dense` implies it
    solo: bool = False


class AttentionFn(Protocol):
    """(q, k, v, layout, causal, window, bias) -> [T, N, D]; see the module docstring."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layout: RaggedLayout,
        causal: bool,
        window: int | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class Scope:
    """One attention call's keys: which each query may see (the layout's sequences, `causal`,
    `window`, plus `bias` on their scores), and what the engine measured on its device."""

    layout: RaggedLayout
    causal: bool
    window: int | None
    bias: torch.Tensor | None
    choices: KernelChoices
