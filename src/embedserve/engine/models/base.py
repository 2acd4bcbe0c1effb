"""What every model is: (input_ids [T], positions [T], token_type_ids [T], layout, attend) ->
hidden states [T, H] over a packed ragged batch, no padding; pooling happens outside the model.

A model is built on the meta device from its family's config and the ops table it computes every
pointwise chain and matrix product through (its layers hold the same table), then its parameters
are assigned from the folder's checkpoint, mapped into the fused layouts (one QKV matrix, one
gate-up matrix) and checked against the config's shapes, in float32 on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from embedserve.engine.attention import AttentionFn, RaggedLayout
from embedserve.engine.ops import Ops
from embedserve.engine.weights import FolderWeights
from embedserve.loading.spec import ModelSpec


class PackedEncoder(nn.Module):
    def __init__(self, cfg: Any, ops: Ops) -> None:
        """`ops`: the pointwise chains and matrix products (`ops.EAGER_OPS` or compiled)."""
        super().__init__()
        self.cfg = cfg
        self.ops = ops

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T], restarting at 0 for each sequence
        token_type_ids: torch.Tensor,  # [T], unused by models without segment embeddings
        layout: RaggedLayout,
        attend: AttentionFn,
    ) -> torch.Tensor:  # [T, H]
        x = self.embeddings(input_ids, positions, token_type_ids)
        return self.encode(x, positions, layout, attend)

    def embeddings(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        """The input embeddings [T, H]."""
        raise NotImplementedError

    def encode(
        self, x: torch.Tensor, positions: torch.Tensor, layout: RaggedLayout, attend: AttentionFn
    ) -> torch.Tensor:
        """The layers over the embeddings: hidden states [T, H]."""
        raise NotImplementedError

    def checkpoint(self, tensors: dict[str, torch.Tensor], source: Path) -> dict[str, torch.Tensor]:
        """This model's state dict from the checkpoint's tensors, by the names transformers reads
        (`loading.tensor_names`: base-model prefix dropped, legacy names renamed)."""
        raise NotImplementedError

    @classmethod
    def build(cls, spec: ModelSpec, ops: Ops) -> PackedEncoder:
        """The model for `spec` (a family whose model takes more than its config says so)."""
        return cls(spec.config, ops)

    @classmethod
    def from_spec(
        cls, spec: ModelSpec, ops: Ops, weights: FolderWeights | None = None
    ) -> PackedEncoder:
        """Build the model and load the folder's checkpoint into it (fp32, on the CPU), read
        through `weights` (by default a reader of its own)."""
        with torch.device("meta"):
            model = cls.build(spec, ops)
        tensors = (weights or FolderWeights(spec)).checkpoint()
        state = model.checkpoint(tensors, spec.path)
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True, assign=True)
        return model.eval()
