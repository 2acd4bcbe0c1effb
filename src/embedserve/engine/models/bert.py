"""BERT-family encoder on a packed ragged batch: no padding, fused QKV, post-layer-norm.

It also runs XLM-RoBERTa / RoBERTa, which differ only in their checkpoint's prefix and in where
positions start (`padding_idx + 1`, `BertConfig.position_offset`); Hugging Face derives
RoBERTa's positions from the non-padding tokens, which for a sequence without padding inside it
is the same offset plus the index.

Shapes: T = tokens in the batch, S = sequences, H = hidden, N = heads, D = head dim.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.attention import AttentionFn, RaggedLayout
from embedserve.engine.layers.linear import Linear
from embedserve.engine.models.base import PackedEncoder
from embedserve.engine.ops import Ops
from embedserve.engine.weights import take
from embedserve.loading.spec import BertConfig, ModelLoadError


def _activation(name: str) -> nn.Module:
    if name == "gelu":
        return nn.GELU()  # exact erf GELU, as Hugging Face's "gelu"
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return nn.GELU(approximate="tanh")
    if name == "relu":
        return nn.ReLU()
    raise ModelLoadError(f"unsupported hidden_act {name!r}")


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig, ops: Ops) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.ops = ops
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.head_dim
        self.qkv = Linear(h, 3 * h, ops)  # query, key, value fused at load time
        self.out = Linear(h, h, ops)
        self.attn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.up = Linear(h, i, ops)
        self.act = _activation(cfg.hidden_act)
        self.down = Linear(i, h, ops)
        self.ffn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        layout: RaggedLayout,
        attend: AttentionFn,
        bias: torch.Tensor | None = None,  # MPNet's relative position bias [N, 2R + 1]
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)  # [T, N, D] each
        a = attend(q, k, v, layout, False, None, bias).reshape(t, -1)  # [T, H]
        x = self._add_norm(self.out, a, x, self.attn_norm)
        return self._add_norm(self.down, self.up.activated(x, self.act), x, self.ffn_norm)

    def _add_norm(
        self, linear: Linear, x: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm
    ) -> torch.Tensor:
        """LayerNorm(linear(x) + residual): on a packed CPU product the sum is its post-op
        (`Linear.plus`), elsewhere the ops table's add + norm (one kernel when compiled)."""
        if linear.packed is not None:
            total = linear.plus(x, residual)
            return F.layer_norm(total, (total.shape[-1],), norm.weight, norm.bias, norm.eps)
        return self.ops.add_layer_norm(linear(x), residual, norm.weight, norm.bias, norm.eps)


class BertEncoder(PackedEncoder):
    cfg: BertConfig

    def __init__(self, cfg: BertConfig, ops: Ops) -> None:
        super().__init__(cfg, ops)
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.embed_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(cfg, ops) for _ in range(cfg.num_layers))

    def embeddings(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        norm = self.embed_norm
        if self.cfg.position_offset:
            positions = positions + self.cfg.position_offset
        return self.ops.bert_embed(
            input_ids,
            positions,
            token_type_ids,
            self.word.weight,
            self.position.weight,
            self.token_type.weight,
            norm.weight,
            norm.bias,
            norm.eps,
        )

    def encode(
        self, x: torch.Tensor, positions: torch.Tensor, layout: RaggedLayout, attend: AttentionFn
    ) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, layout, attend)
        return x

    def checkpoint(self, tensors: dict[str, torch.Tensor], source: Path) -> dict[str, torch.Tensor]:
        """Q, K and V fused into one matrix."""
        cfg, sd = self.cfg, tensors
        h, i = cfg.hidden_size, cfg.intermediate_size
        new: dict[str, torch.Tensor] = {
            "word.weight": take(
                sd, "embeddings.word_embeddings.weight", (cfg.vocab_size, h), source
            ),
            "position.weight": take(
                sd,
                "embeddings.position_embeddings.weight",
                (cfg.max_position_embeddings, h),
                source,
            ),
            "token_type.weight": take(
                sd, "embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, h), source
            ),
            "embed_norm.weight": take(sd, "embeddings.LayerNorm.weight", (h,), source),
            "embed_norm.bias": take(sd, "embeddings.LayerNorm.bias", (h,), source),
        }
        for n in range(cfg.num_layers):
            p = f"encoder.layer.{n}."
            att = p + "attention."
            new[f"layers.{n}.qkv.weight"] = torch.cat(
                [
                    take(sd, f"{att}self.{w}.weight", (h, h), source)
                    for w in ("query", "key", "value")
                ]
            )
            new[f"layers.{n}.qkv.bias"] = torch.cat(
                [take(sd, f"{att}self.{w}.bias", (h,), source) for w in ("query", "key", "value")]
            )
            new[f"layers.{n}.out.weight"] = take(sd, f"{att}output.dense.weight", (h, h), source)
            new[f"layers.{n}.out.bias"] = take(sd, f"{att}output.dense.bias", (h,), source)
            new[f"layers.{n}.attn_norm.weight"] = take(
                sd, f"{att}output.LayerNorm.weight", (h,), source
            )
            new[f"layers.{n}.attn_norm.bias"] = take(
                sd, f"{att}output.LayerNorm.bias", (h,), source
            )
            new[f"layers.{n}.up.weight"] = take(sd, f"{p}intermediate.dense.weight", (i, h), source)
            new[f"layers.{n}.up.bias"] = take(sd, f"{p}intermediate.dense.bias", (i,), source)
            new[f"layers.{n}.down.weight"] = take(sd, f"{p}output.dense.weight", (h, i), source)
            new[f"layers.{n}.down.bias"] = take(sd, f"{p}output.dense.bias", (h,), source)
            new[f"layers.{n}.ffn_norm.weight"] = take(
                sd, f"{p}output.LayerNorm.weight", (h,), source
            )
            new[f"layers.{n}.ffn_norm.bias"] = take(sd, f"{p}output.LayerNorm.bias", (h,), source)
        return new
