"""Gemma 3 as a bidirectional encoder (EmbeddingGemma) on a packed ragged batch.

Embeddings scaled by sqrt(hidden); per layer RMSNorm (scaled by 1 + weight) before and after
attention and before and after the MLP; grouped-query attention with q/k RMSNorm and rotary,
five sliding-window layers (|query - key| <= `sliding_window // 2`) to one global, each type with its
own rotary base; GeGLU (tanh GELU). The sentence-transformers Dense projections after pooling
are the engine's (`engine/pooler/dense.py`).

Shapes: T = tokens in the batch, H = hidden, Nq / Nkv = query / key-value heads, D = head dim.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from embedserve.engine.attention import AttentionFn, RaggedLayout
from embedserve.engine.layers.linear import Linear
from embedserve.engine.layers.norms import GemmaNorm
from embedserve.engine.layers.rotary import Rotary
from embedserve.engine.models.base import PackedEncoder
from embedserve.engine.ops import Ops
from embedserve.engine.weights import decoder_checkpoint
from embedserve.loading.family_configs import Gemma3Config


class Gemma3Layer(nn.Module):
    def __init__(self, cfg: Gemma3Config, ops: Ops, index: int) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.ops = ops
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.window = None if cfg.global_layers[index] else cfg.window
        # the attention kernels scale by D^-0.5; Gemma by query_pre_attn_scalar^-0.5
        self.q_scale = math.sqrt(d / cfg.query_pre_attn_scalar)
        self.approximate = "tanh" if cfg.hidden_act == "gelu_pytorch_tanh" else "none"
        eps = cfg.rms_norm_eps
        self.input_norm = GemmaNorm(h, eps)
        self.qkv = Linear(h, (cfg.num_heads + 2 * cfg.num_kv_heads) * d, ops, bias=False)
        self.q_norm, self.k_norm = GemmaNorm(d, eps), GemmaNorm(d, eps)
        self.out = Linear(cfg.num_heads * d, h, ops, bias=False)
        self.post_attn_norm = GemmaNorm(h, eps)
        self.pre_mlp_norm = GemmaNorm(h, eps)
        self.gate_up = Linear(h, 2 * cfg.intermediate_size, ops, bias=False)
        self.down = Linear(cfg.intermediate_size, h, ops, bias=False)
        self.post_mlp_norm = GemmaNorm(h, eps)

    def forward(
        self,
        h: torch.Tensor,  # [T, H]: this layer's normed input
        residual: torch.Tensor,  # [T, H]
        cos: torch.Tensor,  # [T, 1, D]
        sin: torch.Tensor,
        layout: RaggedLayout,
        attend: AttentionFn,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (MLP output before its post-norm, residual)
        t, d, ops = h.shape[0], self.head_dim, self.ops
        nq, nkv = self.num_heads, self.num_kv_heads
        q, k, v = self.qkv(h).split([nq * d, nkv * d, nkv * d], -1)
        q = ops.gemma_rms_norm(q.view(t, nq, d), self.q_norm.weight, self.q_norm.eps)
        k = ops.gemma_rms_norm(k.view(t, nkv, d), self.k_norm.weight, self.k_norm.eps)
        q, k = ops.rope(q, k, cos, sin)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        a = attend(q, k, v.view(t, nkv, d), layout, False, self.window).reshape(t, -1)
        h, residual = ops.gemma_norm_add_norm(
            self.out(a),
            residual,
            self.post_attn_norm.weight,
            self.pre_mlp_norm.weight,
            self.post_attn_norm.eps,
        )
        return self.down(ops.gelu_mul(self.gate_up(h), self.approximate)), residual


class Gemma3Encoder(PackedEncoder):
    cfg: Gemma3Config

    def __init__(self, cfg: Gemma3Config, ops: Ops) -> None:
        super().__init__(cfg, ops)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Gemma3Layer(cfg, ops, n) for n in range(cfg.num_layers))
        self.norm = GemmaNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = {
            True: Rotary(cfg.global_rope_theta, cfg.head_dim),
            False: Rotary(cfg.local_rope_theta, cfg.head_dim),
        }

    def embeddings(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:  # no segment embeddings
        x = self.embed(input_ids)
        # NOTE: Hugging Face scales by sqrt(hidden) rounded to the model dtype
        return x * float(torch.tensor(math.sqrt(self.cfg.hidden_size)).to(x.dtype))

    def encode(
        self, x: torch.Tensor, positions: torch.Tensor, layout: RaggedLayout, attend: AttentionFn
    ) -> torch.Tensor:
        angles = {kind: rotary(positions, x.dtype) for kind, rotary in self.rotary.items()}
        if not self.layers:
            return self.ops.gemma_rms_norm(x, self.norm.weight, self.norm.eps)
        layers: list[Gemma3Layer] = list(self.layers)  # type: ignore[arg-type]
        first = layers[0].input_norm
        h, residual = self.ops.gemma_rms_norm(x, first.weight, first.eps), x
        for n, layer in enumerate(layers):
            cos, sin = angles[self.cfg.global_layers[n]]
            h, residual = layer(h, residual, cos, sin, layout, attend)
            following = layers[n + 1].input_norm if n + 1 < len(layers) else self.norm
            h, residual = self.ops.gemma_norm_add_norm(
                h, residual, layer.post_mlp_norm.weight, following.weight, following.eps
            )
        return h

    def checkpoint(self, tensors: dict[str, torch.Tensor], source: Path) -> dict[str, torch.Tensor]:
        norms = {
            "input_norm": "input_layernorm",
            "post_attn_norm": "post_attention_layernorm",
            "pre_mlp_norm": "pre_feedforward_layernorm",
            "post_mlp_norm": "post_feedforward_layernorm",
        }
        return decoder_checkpoint(tensors, self.cfg, norms, source)
