"""SPLADE's heads: the masked-LM head from the folder's checkpoint (the decoder tied to the word
embeddings unless the checkpoint has its own: `tensor_names.TIED`), pooled per input
(`pooler.sparse.SpladeHead`)."""

from __future__ import annotations

import torch

from embedserve.engine.pooler.sparse import SparseRows, SpladeHead
from embedserve.engine.retrieval import RetrievalHeads
from embedserve.engine.weights import FolderWeights
from embedserve.loading.spec import ModelLoadError, ModelSpec
from embedserve.loading.tensor_names import TIED, tied_source


def read_splade_head(spec: ModelSpec, weights: FolderWeights) -> SpladeHead:
    cfg, r = spec.bert, spec.retrieval
    assert cfg is not None and r is not None and r.splade is not None
    p = "cls.predictions."
    names = [f"{p}transform.dense.weight", f"{p}transform.dense.bias", f"{p}transform.LayerNorm.weight",
             f"{p}transform.LayerNorm.bias", f"{p}bias", f"{p}decoder.weight", f"{p}decoder.bias"]  # fmt: skip
    tied = [t for n in names for t in TIED.get(n, ())]
    t = weights.tensors(names + tied)
    # a decoder tied to another tensor is left out of the checkpoint: that tensor, then
    decoder, bias = (t.get(n, t.get(tied_source(n, t) or "")) for n in names[5:7])
    if decoder is None or bias is None or f"{p}transform.dense.weight" not in t:
        raise ModelLoadError(
            f"{t.where}: a SPLADE folder needs BertForMaskedLM's cls.predictions head"
        )
    head = SpladeHead(cfg.hidden_size, cfg.vocab_size, cfg.layer_norm_eps, r.splade.pooling,
                      r.splade.activation, cfg.hidden_act)  # fmt: skip
    state = {
        "dense.weight": t[names[0]], "dense.bias": t[names[1]], "norm.weight": t[names[2]],
        "norm.bias": t[names[3]], "decoder.weight": decoder, "decoder.bias": bias,
    }  # fmt: skip
    head.load_state_dict({k: v.float() for k, v in state.items()})
    return head


class SpladeHeads(RetrievalHeads):
    VOCABULARY_PROJECTION = True

    def __init__(self, spec: ModelSpec, weights: FolderWeights) -> None:
        super().__init__(spec)
        self.splade = read_splade_head(spec, weights)

    def sparse_rows(
        self,
        hidden: torch.Tensor,  # [T, H]
        input_ids: torch.Tensor,
        seq_ids: torch.Tensor,
        seqlens: tuple[int, ...],
    ) -> SparseRows:
        return self.splade(hidden, seqlens)
