"""Model definitions written for packed ragged batches, and the one place that picks among them.

Every model maps (input_ids [T], positions [T], token_type_ids [T], layout, attend) to hidden
states [T, H]; pooling happens outside the model. A model receives its ops table at construction
and computes every pointwise chain and matrix product through it (its layers hold the same table).
"""

from __future__ import annotations

from torch import nn

from embedserve.engine.fused import Ops
from embedserve.spec import ModelSpec


def build_model(spec: ModelSpec, ops: Ops) -> nn.Module:
    """Instantiate the model family named by the spec, computing through `ops` (`fused.EAGER_OPS`
    or `fused.compiled_ops()`), and load its checkpoint (fp32, on the CPU)."""
    if spec.family == "bert":
        from embedserve.engine.models.bert import BertEncoder

        assert spec.bert is not None  # read_model_spec sets it for this family
        return BertEncoder.from_folder(spec.path, spec.bert, ops)
    if spec.family == "qwen3":
        from embedserve.engine.models.qwen3 import Qwen3Encoder

        assert spec.qwen3 is not None  # read_model_spec sets it for this family
        return Qwen3Encoder.from_folder(
            spec.path, spec.qwen3, ops, causal=spec.attention == "causal"
        )
    raise ValueError(f"no model definition for family {spec.family!r}")
