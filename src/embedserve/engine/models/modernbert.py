"""ModernBERT on a packed ragged batch: pre-norm, rotary, GeGLU, no biases (by default), and
every third layer global while the others attend over a local window (|query - key| <= 64 for
ModernBERT-base's `local_attention` of 128), with their own rotary base.

Shapes: T = tokens in the batch, H = hidden, N = heads, D = head dim, I = intermediate.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.attention import AttentionFn, RaggedLayout
from embedserve.engine.layers.linear import Linear
from embedserve.engine.layers.norms import Norm
from embedserve.engine.layers.rotary import Rotary
from embedserve.engine.models.base import PackedEncoder
from embedserve.engine.ops import Ops
from embedserve.engine.weights import take
from embedserve.loading.family_configs import ModernBertConfig


def gelu_approximation(act: str) -> str:
    """Hugging Face's activation name -> `F.gelu`'s `approximate`."""
    return "none" if act == "gelu" else "tanh"


class ModernBertLayer(nn.Module):
    def __init__(self, cfg: ModernBertConfig, ops: Ops, index: int) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.ops = ops
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.window = None if cfg.global_layers[index] else cfg.window
        self.approximate = gelu_approximation(cfg.hidden_act)
        # layer 0 has no attention norm: the embeddings were just normed
        self.attn_norm = Norm(h, cfg.norm_eps, cfg.norm_bias) if index else None
        self.qkv = Linear(h, 3 * h, ops, bias=cfg.attention_bias)
        self.out = Linear(h, h, ops, bias=cfg.attention_bias)
        self.mlp_norm = Norm(h, cfg.norm_eps, cfg.norm_bias)
        self.up_gate = Linear(h, 2 * i, ops, bias=cfg.mlp_bias)  # Wi: (input | gate)
        self.down = Linear(i, h, ops, bias=cfg.mlp_bias)

    def forward(
        self,
        h: torch.Tensor,  # [T, H]: this layer's normed input
        residual: torch.Tensor,  # [T, H]: the stream `h` was normed from
        cos: torch.Tensor,  # [T, 1, D], this layer type's
        sin: torch.Tensor,
        layout: RaggedLayout,
        attend: AttentionFn,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (MLP output, residual stream)
        t, ops = h.shape[0], self.ops
        q, k, v = self.qkv(h).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = ops.rope(q, k, cos, sin)
        a = attend(q, k, v, layout, False, self.window).reshape(t, -1)
        norm = self.mlp_norm
        h, residual = ops.add_layer_norm_residual(
            self.out(a), residual, norm.weight, norm.bias, norm.eps
        )
        return self.down(ops.gelu_mul(self.up_gate(h), self.approximate)), residual


class ModernBertEncoder(PackedEncoder):
    cfg: ModernBertConfig

    def __init__(self, cfg: ModernBertConfig, ops: Ops) -> None:
        super().__init__(cfg, ops)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_norm = Norm(cfg.hidden_size, cfg.norm_eps, cfg.norm_bias)
        self.layers = nn.ModuleList(ModernBertLayer(cfg, ops, n) for n in range(cfg.num_layers))
        self.final_norm = Norm(cfg.hidden_size, cfg.norm_eps, cfg.norm_bias)
        self.rotary = {
            True: Rotary(cfg.global_rope_theta, cfg.head_dim),
            False: Rotary(cfg.local_rope_theta, cfg.head_dim),
        }

    def embeddings(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:  # no segment embeddings; rotary positions in every layer
        norm = self.embed_norm
        x = self.embed(input_ids)
        return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, norm.eps)

    def encode(
        self, x: torch.Tensor, positions: torch.Tensor, layout: RaggedLayout, attend: AttentionFn
    ) -> torch.Tensor:
        angles = {kind: rotary(positions, x.dtype) for kind, rotary in self.rotary.items()}
        h, residual = x, x
        for n, layer in enumerate(self.layers):
            if n:
                attn_norm = layer.attn_norm
                assert isinstance(attn_norm, Norm)  # every layer after the first has one
                h, residual = self.ops.add_layer_norm_residual(
                    h, residual, attn_norm.weight, attn_norm.bias, attn_norm.eps
                )
            cos, sin = angles[self.cfg.global_layers[n]]
            h, residual = layer(h, residual, cos, sin, layout, attend)
        norm = self.final_norm
        if not self.layers:
            return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, norm.eps)
        return self.ops.add_layer_norm_residual(h, residual, norm.weight, norm.bias, norm.eps)[0]

    def checkpoint(self, tensors: dict[str, torch.Tensor], source: Path) -> dict[str, torch.Tensor]:
        cfg, sd = self.cfg, tensors
        h, i = cfg.hidden_size, cfg.intermediate_size

        def norm(ours: str, theirs: str) -> None:
            new[ours + "weight"] = take(sd, theirs + "weight", (h,), source)
            if cfg.norm_bias:
                new[ours + "bias"] = take(sd, theirs + "bias", (h,), source)

        def linear(ours: str, theirs: str, shape: tuple[int, int], bias: bool) -> None:
            new[ours + "weight"] = take(sd, theirs + "weight", shape, source)
            if bias:
                new[ours + "bias"] = take(sd, theirs + "bias", (shape[0],), source)

        new: dict[str, torch.Tensor] = {
            "embed.weight": take(
                sd, "embeddings.tok_embeddings.weight", (cfg.vocab_size, h), source
            )
        }
        norm("embed_norm.", "embeddings.norm.")
        norm("final_norm.", "final_norm.")
        for n in range(cfg.num_layers):
            p = f"layers.{n}."
            if n:
                norm(p + "attn_norm.", p + "attn_norm.")
            norm(p + "mlp_norm.", p + "mlp_norm.")
            linear(p + "qkv.", p + "attn.Wqkv.", (3 * h, h), cfg.attention_bias)
            linear(p + "out.", p + "attn.Wo.", (h, h), cfg.attention_bias)
            linear(p + "up_gate.", p + "mlp.Wi.", (2 * i, h), cfg.mlp_bias)
            linear(p + "down.", p + "mlp.Wo.", (h, i), cfg.mlp_bias)
        return new
