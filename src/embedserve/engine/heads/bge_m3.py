"""bge-m3's heads: `sparse_linear.pt` (hidden -> 1: a lexical weight per token, the largest per
token id, its special tokens dropped) and `colbert_linear.pt` (hidden -> hidden: a vector per
token after CLS), read as tensors only (`retrieval.read_pt_head`); its dense output is CLS."""

from __future__ import annotations

import torch

from embedserve.engine.pooler.sparse import SparseRows, lexical_weights, relu_weights
from embedserve.engine.retrieval import RetrievalHeads, read_pt_head
from embedserve.engine.weights import FolderWeights
from embedserve.loading.retrieval import M3_COLBERT_HEAD, M3_SPARSE_HEAD
from embedserve.loading.spec import ModelSpec


class M3Heads(RetrievalHeads):
    def __init__(self, spec: ModelSpec, weights: FolderWeights) -> None:
        super().__init__(spec)
        assert spec.retrieval is not None and spec.retrieval.m3 is not None
        hidden = spec.config.hidden_size
        self.sparse_linear = read_pt_head(weights.folder / M3_SPARSE_HEAD, hidden)
        self.token_head = read_pt_head(weights.folder / M3_COLBERT_HEAD, hidden)
        self.set_drop_ids(spec.retrieval.m3.unused_ids)  # CLS, EOS, PAD, UNK

    def sparse_rows(
        self,
        hidden: torch.Tensor,  # [T, H]
        input_ids: torch.Tensor,
        seq_ids: torch.Tensor,
        seqlens: tuple[int, ...],
    ) -> SparseRows:
        weights = relu_weights(self.sparse_linear, hidden)
        return lexical_weights(weights, input_ids, seq_ids, self.drop_ids, self.vocab, len(seqlens))
