"""MPNet (all-mpnet-base-v2) on a packed ragged batch: BERT's post-norm layers, RoBERTa's
positions (after the padding index), no token types, and one relative position bias shared by
every layer, added to the attention scores.

The bias is T5's bidirectional bucketing of key - query distance (32 buckets, exact up to 8,
logarithmic up to 128, one bucket beyond) mapped to a value per head. As every distance past
128 shares a bucket, the model hands attention a table over distances -128..128 per head
(`attention.masks.distance_bias`), never a [T, T] matrix of its own.

Shapes: T = tokens in the batch, H = hidden, N = heads.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.attention import AttentionFn, RaggedLayout
from embedserve.engine.models.base import PackedEncoder
from embedserve.engine.models.bert import BertLayer
from embedserve.engine.ops import Ops
from embedserve.engine.weights import FolderWeights, take
from embedserve.loading.family_configs import BertConfig
from embedserve.loading.spec import ModelSpec

MAX_DISTANCE = 128  # Hugging Face's `relative_position_bucket` default, fixed in MPNet


def relative_buckets(distance: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Bucket of each key - query distance: half the buckets per direction, the first half of
    each exact, the rest logarithmic up to MAX_DISTANCE."""
    half = num_buckets // 2
    exact = half // 2
    n = -distance
    bucket = (n < 0).long() * half
    n = n.abs()
    scaled = torch.log(n.float().clamp_min(1) / exact) / math.log(MAX_DISTANCE / exact)
    large = (exact + (scaled * (half - exact)).long()).clamp_max(half - 1)
    return bucket + torch.where(n < exact, n, large)


def _distance_buckets(num_buckets: int) -> torch.Tensor:
    """[2 * MAX_DISTANCE + 1]: the bucket of each distance -MAX_DISTANCE..MAX_DISTANCE."""
    return relative_buckets(torch.arange(-MAX_DISTANCE, MAX_DISTANCE + 1), num_buckets)


class MPNetEncoder(PackedEncoder):
    cfg: BertConfig

    def __init__(self, cfg: BertConfig, ops: Ops) -> None:
        super().__init__(cfg, ops)
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.embed_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(cfg, ops) for _ in range(cfg.num_layers))
        self.relative = nn.Embedding(cfg.relative_buckets, cfg.num_heads)
        buckets = _distance_buckets(cfg.relative_buckets)
        self.register_buffer("distance_buckets", buckets, persistent=False)

    def embeddings(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:  # MPNet has no segment embeddings
        norm = self.embed_norm
        x = self.word(input_ids) + self.position(positions + self.cfg.position_offset)
        return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, norm.eps)

    def encode(
        self, x: torch.Tensor, positions: torch.Tensor, layout: RaggedLayout, attend: AttentionFn
    ) -> torch.Tensor:
        bias = self.relative(self.distance_buckets).T.contiguous()  # [N, 2 * 128 + 1]
        for layer in self.layers:
            x = layer(x, layout, attend, bias)
        return x

    @classmethod
    def from_spec(
        cls, spec: ModelSpec, ops: Ops, weights: FolderWeights | None = None
    ) -> PackedEncoder:
        model = super().from_spec(spec, ops, weights)
        # a buffer outside the checkpoint: built on the meta device, so built again here
        model.distance_buckets = _distance_buckets(model.cfg.relative_buckets)
        return model

    def checkpoint(self, tensors: dict[str, torch.Tensor], source: Path) -> dict[str, torch.Tensor]:
        cfg, sd = self.cfg, tensors
        h, i = cfg.hidden_size, cfg.intermediate_size
        e = "embeddings."
        new: dict[str, torch.Tensor] = {
            "word.weight": take(sd, e + "word_embeddings.weight", (cfg.vocab_size, h), source),
            "position.weight": take(
                sd, e + "position_embeddings.weight", (cfg.max_position_embeddings, h), source
            ),
            "embed_norm.weight": take(sd, e + "LayerNorm.weight", (h,), source),
            "embed_norm.bias": take(sd, e + "LayerNorm.bias", (h,), source),
            "relative.weight": take(
                sd,
                "encoder.relative_attention_bias.weight",
                (cfg.relative_buckets, cfg.num_heads),
                source,
            ),
        }
        for n in range(cfg.num_layers):
            p, ours = f"encoder.layer.{n}.", f"layers.{n}."
            att = p + "attention."
            for kind in ("weight", "bias"):
                shape: tuple[int, ...] = (h, h) if kind == "weight" else (h,)
                new[ours + "qkv." + kind] = torch.cat(
                    [take(sd, f"{att}attn.{w}.{kind}", shape, source) for w in "qkv"]
                )
                new[ours + "out." + kind] = take(sd, f"{att}attn.o.{kind}", shape, source)
                new[ours + "attn_norm." + kind] = take(sd, f"{att}LayerNorm.{kind}", (h,), source)
                up: tuple[int, ...] = (i, h) if kind == "weight" else (i,)
                new[ours + "up." + kind] = take(sd, f"{p}intermediate.dense.{kind}", up, source)
                down: tuple[int, ...] = (h, i) if kind == "weight" else (h,)
                new[ours + "down." + kind] = take(sd, f"{p}output.dense.{kind}", down, source)
                new[ours + "ffn_norm." + kind] = take(
                    sd, f"{p}output.LayerNorm.{kind}", (h,), source
                )
        return new
