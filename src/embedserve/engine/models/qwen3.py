"""Qwen3 decoder as an embedder on a packed ragged batch: no padding, no KV cache.

RMSNorm before attention and MLP, RMSNorm on each query/key head, rotary embeddings from each
token's position in its own sequence, grouped-query attention, SwiGLU. Q, K, V are one matrix
and gate, up are one matrix, fused at load time. Attention is causal (Qwen3-Embedding) or
bidirectional (pplx-embed style), fixed per model.

Shapes: T = tokens in the batch, H = hidden, Nq / Nkv = query / key-value heads, D = head dim,
I = intermediate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from embedserve.engine.attention import AttentionFn, RaggedLayout
from embedserve.engine.layers.linear import Linear
from embedserve.engine.layers.norms import RMSNorm
from embedserve.engine.layers.rotary import Rotary
from embedserve.engine.models.base import PackedEncoder
from embedserve.engine.ops import Ops, composed
from embedserve.engine.weights import decoder_checkpoint
from embedserve.loading.spec import ModelSpec, Qwen3Config


class Qwen3Layer(nn.Module):
    def __init__(self, cfg: Qwen3Config, ops: Ops) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.ops = ops
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.input_norm = RMSNorm(h, cfg.rms_norm_eps)
        # query, key, value fused at load time: [(Nq + 2 Nkv) D, H]
        self.qkv = Linear(
            h, (cfg.num_heads + 2 * cfg.num_kv_heads) * d, ops, bias=cfg.attention_bias
        )
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.out = Linear(cfg.num_heads * d, h, ops, bias=False)
        self.post_attn_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.gate_up = Linear(h, 2 * cfg.intermediate_size, ops, bias=False)  # gate, up fused
        self.down = Linear(cfg.intermediate_size, h, ops, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # [T, H]: the previous layer's MLP output (the embeddings for layer 0)
        residual: torch.Tensor | None,  # [T, H]: the stream before `x` is added; None at layer 0
        cos: torch.Tensor,  # [T, 1, D]
        sin: torch.Tensor,  # [T, 1, D]
        layout: RaggedLayout,
        attend: AttentionFn,
        causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (MLP output, residual stream), both [T, H]
        t, ops = x.shape[0], self.ops
        norm = self.input_norm
        if residual is None:
            h, residual = ops.rms_norm(x, norm.weight, norm.eps), x
        else:
            h, residual = ops.add_rms_norm(x, residual, norm.weight, norm.eps)
        # QKV product, per-head q/k norm and rotary: [T, Nq, D], [T, Nkv, D], [T, Nkv, D]
        chain = ops.qkv_norm_rope if self.qkv.packed is None else self._packed_qkv_norm_rope
        q, k, v = chain(
            h,
            self.qkv.weight,
            self.qkv.bias,
            self.num_heads,
            self.num_kv_heads,
            self.q_norm.weight,
            self.k_norm.weight,
            cos,
            sin,
            self.q_norm.eps,
        )
        a = attend(q, k, v, layout, causal)  # [T, Nq, D]
        norm = self.post_attn_norm
        h, residual = ops.add_rms_norm(self.out(a.reshape(t, -1)), residual, norm.weight, norm.eps)
        return self.down(self.gate_up.silu_mul(h)), residual  # SiLU(gate) × up: [T, I]

    def _packed_qkv_norm_rope(self, x: torch.Tensor, *args: Any) -> tuple[torch.Tensor, ...]:
        """`ops.qkv_norm_rope` with the packed CPU product (`Linear.pack`) as its product."""
        return composed(lambda x, w, b: self.qkv(x), self.ops.silu_mul, self.ops.qk_norm_rope)[
            "qkv_norm_rope"
        ](x, *args)


class Qwen3Encoder(PackedEncoder):
    cfg: Qwen3Config

    def __init__(self, cfg: Qwen3Config, ops: Ops, *, causal: bool) -> None:
        super().__init__(cfg, ops)
        self.causal = causal
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen3Layer(cfg, ops) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.rope_theta, cfg.head_dim)  # float32 frequencies, per device

    @classmethod
    def build(cls, spec: ModelSpec, ops: Ops) -> PackedEncoder:
        assert isinstance(spec.config, Qwen3Config)
        return cls(spec.config, ops, causal=spec.attention == "causal")

    def embeddings(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:  # Qwen3 has no segment embeddings
        return self.embed(input_ids)

    def encode(
        self, x: torch.Tensor, positions: torch.Tensor, layout: RaggedLayout, attend: AttentionFn
    ) -> torch.Tensor:
        # rotary angles from each token's own position: sequences packed together each start at 0
        cos, sin = self.rotary(positions, x.dtype)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            x, residual = layer(x, residual, cos, sin, layout, attend, self.causal)
        if residual is None:  # a model with no layers
            return self.ops.rms_norm(x, self.norm.weight, self.norm.eps)
        return self.ops.add_rms_norm(x, residual, self.norm.weight, self.norm.eps)[0]

    def checkpoint(self, tensors: dict[str, torch.Tensor], source: Path) -> dict[str, torch.Tensor]:
        norms = {"input_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm"}
        return decoder_checkpoint(
            tensors, self.cfg, norms, source, qkv_bias=self.cfg.attention_bias
        )
