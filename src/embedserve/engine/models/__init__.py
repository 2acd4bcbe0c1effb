"""Model definitions written for packed ragged batches, and the one place that picks among them.

Every model maps (input_ids [T], positions [T], token_type_ids [T], layout, attend) to hidden
states [T, H]; pooling happens outside the model. A model receives its ops table at construction
and computes every pointwise chain and matrix product through it (its layers hold the same table).
"""

from __future__ import annotations

from torch import nn

from embedserve.engine.fused import Ops
from embedserve.loading.families import (
    BertConfig,
    Gemma3Config,
    ModernBertConfig,
    NomicBertConfig,
    Qwen3Config,
)
from embedserve.loading.spec import ModelSpec


def build_model(spec: ModelSpec, ops: Ops) -> nn.Module:
    """Instantiate the model family named by the spec, computing through `ops` (`fused.EAGER_OPS`
    or `fused.compiled_ops()`), and load its checkpoint (fp32, on the CPU)."""
    cfg = spec.config
    if isinstance(cfg, BertConfig) and cfg.relative_buckets:
        from embedserve.engine.models.mpnet import MPNetEncoder

        return MPNetEncoder.from_folder(spec.path, cfg, ops)
    if isinstance(cfg, BertConfig):  # BERT and XLM-RoBERTa
        from embedserve.engine.models.bert import BertEncoder

        return BertEncoder.from_folder(spec.path, cfg, ops)
    if isinstance(cfg, NomicBertConfig):
        from embedserve.engine.models.nomic_bert import NomicBertEncoder

        return NomicBertEncoder.from_folder(spec.path, cfg, ops)
    if isinstance(cfg, ModernBertConfig):
        from embedserve.engine.models.modernbert import ModernBertEncoder

        return ModernBertEncoder.from_folder(spec.path, cfg, ops)
    if isinstance(cfg, Gemma3Config):
        from embedserve.engine.models.gemma3 import Gemma3Encoder

        return Gemma3Encoder.from_folder(spec.path, cfg, ops)
    if isinstance(cfg, Qwen3Config):
        from embedserve.engine.models.qwen3 import Qwen3Encoder

        return Qwen3Encoder.from_folder(spec.path, cfg, ops, causal=spec.attention == "causal")
    raise ValueError(f"no model definition for family {spec.family!r}")
