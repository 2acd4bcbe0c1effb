"""Model definitions written for packed ragged batches (one file per family, each a
`base.PackedEncoder`), and the builder that picks one by the family registry's row.

Every model maps (input_ids [T], positions [T], token_type_ids [T], layout, attend) to hidden
states [T, H]; pooling happens outside the model. A model receives its ops table at construction
and computes every pointwise chain and matrix product through it (its layers hold the same table).
"""

from __future__ import annotations

import importlib

from embedserve.engine.models.base import PackedEncoder
from embedserve.engine.ops import Ops
from embedserve.engine.weights import FolderWeights
from embedserve.loading.spec import ModelSpec


def model_class(spec: ModelSpec) -> type[PackedEncoder]:
    """The engine model named by the family's row (`Family.model`, "module:Class")."""
    module, _, name = spec.family_row.model.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, PackedEncoder)):
        raise TypeError(f"{spec.family_row.model} is not a packed encoder model")
    return cls


def build_model(spec: ModelSpec, ops: Ops, weights: FolderWeights | None = None) -> PackedEncoder:
    """Instantiate the model family named by the spec, computing through `ops` (`ops.EAGER_OPS`
    or `ops.compiled_ops()`), and load its checkpoint (fp32, on the CPU) through `weights`."""
    return model_class(spec).from_spec(spec, ops, weights)
