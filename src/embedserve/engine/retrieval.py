"""The heads of the sparse and multi-vector layouts (`loading.retrieval`) on the engine's hidden
states, and what one forward gives: dense rows, sparse rows and token vectors, each only when
asked for, all from the same hidden states.

Weights: SPLADE's masked-LM head from the folder's checkpoint (the decoder tied to the word
embeddings unless the checkpoint has its own: `tensor_names.TIED`); PyLate's Dense projection from
its module's safetensors (or an older `pytorch_model.bin`); bge-m3's `sparse_linear.pt` / `colbert_linear.pt` with `torch.load(...,
weights_only=True)`, which builds tensors and plain containers only and refuses any other pickled
object (no code runs), then checked to be exactly a Linear's weight and bias (SECURITY.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.attention import AttentionFn, RaggedLayout
from embedserve.engine.batch import PackedBatch
from embedserve.engine.pooler.multivector import (
    TokenVectors,
    after_first,
    not_skipped,
    token_vectors,
)
from embedserve.engine.pooler.sparse import SparseRows, SpladeHead, lexical_weights, relu_weights
from embedserve.engine.weights import read_dense_tensors, read_tensors
from embedserve.loading.retrieval import M3_COLBERT_HEAD, M3_SPARSE_HEAD, RetrievalSpec
from embedserve.loading.spec import ModelLoadError, ModelSpec
from embedserve.loading.tensor_names import TIED, tied_source

CONVERT_PT = (
    'python -c "import torch,safetensors.torch as s,sys; '
    "s.save_file(torch.load(sys.argv[1],weights_only=True),sys.argv[1][:-3]+'.safetensors')\" FILE.pt"
)


@dataclass(frozen=True)
class BatchOutputs:
    """One forward's outputs for the S inputs of a batch (None where not asked for)."""

    dense: np.ndarray | None = None  # [S, H] float32, before the output head
    sparse: SparseRows | None = None
    multivector: TokenVectors | None = None


def _linear(state: dict[str, torch.Tensor], source: Path, fan_in: int) -> nn.Linear:
    """A Linear from exactly its weight (and bias), checked against the input width."""
    weight, bias = state.get("weight"), state.get("bias")
    extra = set(state) - {"weight", "bias"}
    if (
        not isinstance(weight, torch.Tensor)
        or weight.ndim != 2
        or weight.shape[1] != fan_in
        or extra
    ):
        raise ModelLoadError(f"{source}: expected a Linear's weight [out, {fan_in}] (and bias)")
    linear = nn.Linear(fan_in, weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(weight.float())
        if bias is not None:
            linear.bias.copy_(bias.float().reshape(-1))
    return linear


def read_pt_head(path: Path, fan_in: int) -> nn.Linear:
    """A FlagEmbedding head file, unpickled with weights_only=True (tensors only, no code)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # an UnpicklingError for anything but tensors and containers
        raise ModelLoadError(
            f"{path}: not a plain tensor file ({type(e).__name__}); convert it with {CONVERT_PT}"
        ) from None
    if not isinstance(state, dict):
        raise ModelLoadError(f"{path}: expected a state dict, got {type(state).__name__}")
    return _linear(state, path, fan_in)


def _splade_head(spec: ModelSpec) -> SpladeHead:
    cfg, r = spec.bert, spec.retrieval
    assert cfg is not None and r is not None and r.splade is not None
    p = "cls.predictions."
    names = [f"{p}transform.dense.weight", f"{p}transform.dense.bias", f"{p}transform.LayerNorm.weight",
             f"{p}transform.LayerNorm.bias", f"{p}bias", f"{p}decoder.weight", f"{p}decoder.bias"]  # fmt: skip
    tied = [t for n in names for t in TIED.get(n, ())]
    t = read_tensors(spec.path, names + tied, spec.family_row.prefixes)
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


class RetrievalHeads(nn.Module):
    """The heads one layout has, in float32, and the outputs they make from hidden states."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        r = spec.retrieval
        assert r is not None
        self.spec: RetrievalSpec = r
        self.vocab = spec.vocab_size
        self.splade = _splade_head(spec) if r.splade is not None else None
        self.sparse_linear: nn.Linear | None = None
        self.colbert_linear: nn.Module | None = None
        hidden = spec.config.hidden_size
        ids: Sequence[int] = ()
        if r.m3 is not None:
            self.sparse_linear = read_pt_head(spec.path / M3_SPARSE_HEAD, hidden)
            self.colbert_linear = read_pt_head(spec.path / M3_COLBERT_HEAD, hidden)
            ids = r.m3.unused_ids
        if r.colbert is not None:
            layers = []
            for sub, (fan_in, _, _) in zip(r.colbert.dense_paths, r.colbert.dims, strict=True):
                tensors = read_dense_tensors(spec.path / sub)  # safetensors, or an old .bin
                state = {k.removeprefix("linear."): v for k, v in tensors.items()}
                weights = tensors.where
                layers.append(_linear(state, weights, fan_in))
            self.colbert_linear = nn.Sequential(*layers)
            ids = r.colbert.skiplist_ids
        # the width of each multi-vector row (0: none)
        self.multivector_dims = (
            0
            if self.colbert_linear is None
            else int(self.colbert_linear(torch.zeros(1, hidden)).shape[-1])
        )
        if self.multivector_dims != r.multivector_dims:
            raise ModelLoadError(
                f"{spec.path}: the multi-vector head gives {self.multivector_dims} dims, not the "
                f"{r.multivector_dims} the folder declares (bge-m3: colbert_linear.pt is "
                "hidden -> hidden)"
            )
        # bge-m3's dropped special tokens, or ColBERT's document skip-list
        self.drop_ids: torch.Tensor
        self.register_buffer(
            "drop_ids", torch.tensor(list(ids), dtype=torch.int64), persistent=False
        )

    def forward(
        self,
        hidden: torch.Tensor,  # [T, H]
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        seq_ids: torch.Tensor,
        seqlens: tuple[int, ...],
        outputs: Sequence[str],
        query: bool,
    ) -> BatchOutputs:
        n = len(seqlens)
        dense = sparse = vectors = None
        if "dense" in outputs:
            dense = hidden[positions == 0].float().cpu().numpy()  # CLS, as bge-m3 pools
        if "sparse" in outputs and self.splade is not None:
            sparse = self.splade(hidden, seqlens)
        elif "sparse" in outputs and self.sparse_linear is not None:
            weights = relu_weights(self.sparse_linear, hidden)
            sparse = lexical_weights(weights, input_ids, seq_ids, self.drop_ids, self.vocab, n)
        if "multivector" in outputs and self.colbert_linear is not None:
            if self.spec.kind == "bge-m3":
                keep = after_first(positions)
            elif query:  # a ColBERT query keeps every token, its expansion included
                keep = torch.ones_like(input_ids, dtype=torch.bool)
            else:
                keep = not_skipped(input_ids, self.drop_ids)
            vectors = token_vectors(hidden, keep, seq_ids, self.colbert_linear, n)
        return BatchOutputs(dense, sparse, vectors)

    def of_batch(
        self, hidden: torch.Tensor, batch: PackedBatch, outputs: Sequence[str], query: bool
    ) -> BatchOutputs:
        """`forward` on the hidden rows [T, H] of `batch` (its ids, positions and sequences
        moved to their device)."""
        dev = {
            k: torch.from_numpy(getattr(batch, k)).to(hidden.device)
            for k in ("input_ids", "positions", "seq_ids")
        }
        seqlens = tuple(batch.seqlens.tolist())
        return self(
            hidden, dev["input_ids"], dev["positions"], dev["seq_ids"], seqlens, outputs, query
        )


def build_retrieval(spec: ModelSpec) -> RetrievalHeads | None:
    return RetrievalHeads(spec) if spec.retrieval is not None else None


def visible_keys_attention(visible: Sequence[int]) -> AttentionFn:
    """Attention in which sequence i's queries see only its first `visible[i]` keys: a ColBERT
    query's expansion tokens read the query but no token reads them (PyLate's attention mask of
    0 on them, unless `attend_to_expansion_tokens`). One SDPA per sequence, as `sdpa_loop`."""

    def attend(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layout: RaggedLayout,
        causal: bool,
        *window_bias: object,
    ) -> torch.Tensor:
        if causal or any(x is not None for x in window_bias):
            raise ValueError("query expansion runs bidirectional encoders without windows")
        out = torch.empty_like(q)
        start = 0
        for n, m in zip(layout.seqlens, visible, strict=True):
            qs = q[None, start : start + n].transpose(1, 2)
            ks, vs = (t[None, start : start + m].transpose(1, 2) for t in (k, v))
            out[start : start + n] = F.scaled_dot_product_attention(qs, ks, vs)[0].transpose(0, 1)
            start += n
        return out

    return attend  # type: ignore[return-value]  # keyword names aside, the same call
