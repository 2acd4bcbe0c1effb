"""ColBERT's (PyLate's) heads: the Dense projection of each kept token, from each module's
safetensors (or an older `pytorch_model.bin`); a document's skip-list tokens give no vector."""

from __future__ import annotations

from torch import nn

from embedserve.engine.retrieval import RetrievalHeads, linear_from_state
from embedserve.engine.weights import FolderWeights
from embedserve.loading.spec import ModelSpec


class ColbertHeads(RetrievalHeads):
    def __init__(self, spec: ModelSpec, weights: FolderWeights) -> None:
        super().__init__(spec)
        colbert = spec.retrieval.colbert if spec.retrieval is not None else None
        assert colbert is not None
        layers = []
        for sub, (fan_in, _, _) in zip(colbert.dense_paths, colbert.dims, strict=True):
            tensors = weights.dense(sub)  # safetensors, or an old .bin
            state = {k.removeprefix("linear."): v for k, v in tensors.items()}
            layers.append(linear_from_state(state, tensors.where, fan_in))
        self.token_head = nn.Sequential(*layers)
        self.set_drop_ids(colbert.skiplist_ids)
