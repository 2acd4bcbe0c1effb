"""NomicBERT (nomic-embed-text) on a packed ragged batch: BERT's post-norm layers with rotary
positions instead of a position table, SwiGLU, and no biases but the norms'.

Loads both checkpoint layouts: transformers' (`layers.N.self_attn.q_proj`, ...) and the one
nomic's own remote code saves (`encoder.layers.N.attn.Wqkv`, `mlp.fc11` = up, `fc12` = gate).

Shapes: T = tokens in the batch, H = hidden, N = heads, D = head dim, I = intermediate.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from embedserve.engine.attention import AttentionFn, RaggedLayout
from embedserve.engine.layers.linear import Linear
from embedserve.engine.layers.rotary import Rotary
from embedserve.engine.models.base import PackedEncoder
from embedserve.engine.ops import Ops
from embedserve.engine.weights import take
from embedserve.loading.family_configs import NomicBertConfig


class NomicBertLayer(nn.Module):
    def __init__(self, cfg: NomicBertConfig, ops: Ops) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.ops = ops
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = Linear(h, 3 * h, ops, bias=False)
        self.out = Linear(h, h, ops, bias=False)
        self.attn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.gate_up = Linear(h, 2 * i, ops, bias=False)
        self.down = Linear(i, h, ops, bias=False)
        self.mlp_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        cos: torch.Tensor,  # [T, 1, D]
        sin: torch.Tensor,
        layout: RaggedLayout,
        attend: AttentionFn,
    ) -> torch.Tensor:
        t, ops = x.shape[0], self.ops
        q, k, v = self.qkv(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = ops.rope(q, k, cos, sin)
        a = attend(q, k, v, layout, False).reshape(t, -1)
        norm = self.attn_norm
        x = ops.add_layer_norm(self.out(a), x, norm.weight, norm.bias, norm.eps)
        norm = self.mlp_norm
        mlp = self.down(ops.silu_mul(self.gate_up(x)))
        return ops.add_layer_norm(mlp, x, norm.weight, norm.bias, norm.eps)


class NomicBertEncoder(PackedEncoder):
    cfg: NomicBertConfig

    def __init__(self, cfg: NomicBertConfig, ops: Ops) -> None:
        super().__init__(cfg, ops)
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.embed_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(NomicBertLayer(cfg, ops) for _ in range(cfg.num_layers))
        self.rotary = Rotary(cfg.rope_theta, cfg.head_dim)

    def embeddings(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:  # no position table: rotary in every layer
        norm = self.embed_norm
        x = self.word(input_ids) + self.token_type(token_type_ids)
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, norm.eps)

    def encode(
        self, x: torch.Tensor, positions: torch.Tensor, layout: RaggedLayout, attend: AttentionFn
    ) -> torch.Tensor:
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, layout, attend)
        return x

    def checkpoint(self, tensors: dict[str, torch.Tensor], source: Path) -> dict[str, torch.Tensor]:
        cfg, sd = self.cfg, tensors
        h, i = cfg.hidden_size, cfg.intermediate_size
        remote = any(name.startswith("encoder.layers.") for name in sd)
        emb_ln = "emb_ln." if remote else "embeddings.LayerNorm."
        new: dict[str, torch.Tensor] = {
            "word.weight": take(
                sd, "embeddings.word_embeddings.weight", (cfg.vocab_size, h), source
            ),
            "token_type.weight": take(
                sd, "embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, h), source
            ),
            "embed_norm.weight": take(sd, emb_ln + "weight", (h,), source),
            "embed_norm.bias": take(sd, emb_ln + "bias", (h,), source),
        }
        for n in range(cfg.num_layers):
            p = f"layers.{n}."
            if remote:
                r = f"encoder.layers.{n}."
                qkv = take(sd, r + "attn.Wqkv.weight", (3 * h, h), source)
                out, norms = r + "attn.out_proj.weight", (r + "norm1.", r + "norm2.")
                gate, up, down = r + "mlp.fc12.weight", r + "mlp.fc11.weight", r + "mlp.fc2.weight"
            else:
                a = p + "self_attn."
                qkv = torch.cat(
                    [take(sd, f"{a}{w}_proj.weight", (h, h), source) for w in ("q", "k", "v")]
                )
                out = a + "o_proj.weight"
                norms = (p + "post_attention_layernorm.", p + "post_mlp_layernorm.")
                gate, up, down = (f"{p}mlp.{w}_proj.weight" for w in ("gate", "up", "down"))
            new[p + "qkv.weight"] = qkv
            new[p + "out.weight"] = take(sd, out, (h, h), source)
            for ours, theirs in zip(("attn_norm.", "mlp_norm."), norms, strict=True):
                new[p + ours + "weight"] = take(sd, theirs + "weight", (h,), source)
                new[p + ours + "bias"] = take(sd, theirs + "bias", (h,), source)
            new[p + "gate_up.weight"] = torch.cat(
                [take(sd, gate, (i, h), source), take(sd, up, (i, h), source)]
            )
            new[p + "down.weight"] = take(sd, down, (h, i), source)
        return new
