"""What one forward of a sparse or multi-vector model gives (dense rows, sparse rows and token
vectors, each only when asked for, all from the same hidden states), the base of each retrieval
kind's heads (a file under `engine/heads/`, named by the kind's row of
`loading.retrieval_kinds`), and the readers of their Linear layers.

Weights: bge-m3's `sparse_linear.pt` / `colbert_linear.pt` are read with `torch.load(...,
weights_only=True)`, which builds tensors and plain containers only and refuses any other pickled
object (no code runs), then checked to be exactly a Linear's weight and bias (SECURITY.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.attention import RaggedLayout
from embedserve.engine.batch import PackedBatch
from embedserve.engine.pooler.multivector import (
    TokenVectors,
    after_first,
    not_skipped,
    token_vectors,
)
from embedserve.engine.pooler.sparse import SparseRows
from embedserve.engine.weights import FolderWeights
from embedserve.loading.retrieval import RetrievalSpec
from embedserve.loading.retrieval_kinds import KIND_BY_NAME
from embedserve.loading.spec import ModelLoadError, ModelSpec

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


def linear_from_state(state: dict[str, torch.Tensor], source: Path, fan_in: int) -> nn.Linear:
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
    return linear_from_state(state, path, fan_in)


class RetrievalHeads(nn.Module):
    """The heads of one retrieval kind in float32, and the outputs they make from hidden states.
    Each kind's heads are a subclass in a file of `engine/heads/`, named by its row
    (`retrieval_kinds.RetrievalKind.heads`): it overrides `sparse_rows` if the kind has a sparse
    output, `token_head` (the projection of each kept token) if it has a multi-vector one, and
    `drop_ids`, the token ids its row's rules drop."""

    # a head that projects every token onto the vocabulary (SPLADE's masked-LM head): a large
    # product, run on every torch thread (`of_batch`)
    VOCABULARY_PROJECTION = False

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        r = spec.retrieval
        assert r is not None
        self.spec: RetrievalSpec = r
        self.kind = KIND_BY_NAME[r.kind]
        self.vocab = spec.vocab_size
        self.token_head: nn.Module | None = None
        self.multivector_dims = 0  # the width of each multi-vector row (0: none)
        self.drop_ids: torch.Tensor
        self.register_buffer("drop_ids", torch.zeros(0, dtype=torch.int64), persistent=False)

    def set_drop_ids(self, ids: Sequence[int]) -> None:
        self.drop_ids = torch.tensor(list(ids), dtype=torch.int64)

    def sparse_rows(
        self,
        hidden: torch.Tensor,  # [T, H]
        input_ids: torch.Tensor,
        seq_ids: torch.Tensor,
        seqlens: tuple[int, ...],
    ) -> SparseRows | None:
        """Per input, its sparse entries (None: the kind has no sparse output)."""
        return None

    def kept(self, input_ids: torch.Tensor, positions: torch.Tensor, query: bool) -> torch.Tensor:
        """[T] bool: the tokens that give a multi-vector row, by the row's `multivector_tokens`
        (the server bounds an answer by the same rule: `retrieval.results.multivector_rows`)."""
        if self.kind.multivector_tokens == "after_first":
            return after_first(positions)
        if self.kind.multivector_tokens == "skiplist" and not query:
            return not_skipped(input_ids, self.drop_ids)
        return torch.ones_like(input_ids, dtype=torch.bool)  # a query's expansion included

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
        if "sparse" in outputs:
            sparse = self.sparse_rows(hidden, input_ids, seq_ids, seqlens)
        if "multivector" in outputs and self.token_head is not None:
            keep = self.kept(input_ids, positions, query)
            vectors = token_vectors(hidden, keep, seq_ids, self.token_head, n)
        return BatchOutputs(dense, sparse, vectors)

    def of_batch(
        self,
        hidden: torch.Tensor,
        batch: PackedBatch,
        outputs: Sequence[str],
        query: bool,
        threads: Callable[[int], AbstractContextManager[Any]] | None = None,
    ) -> BatchOutputs:
        """`forward` on the hidden rows [T, H] of `batch` (its ids, positions and sequences
        moved to their device). `threads`: what the engine's forward of so many tokens ran
        inside (`cpu_executors.forward_context`); heads of a few small products run inside it
        too, a projection onto the vocabulary (`VOCABULARY_PROJECTION`) on every thread.

        NOTE: after ONNX Runtime's forward, a head at two torch threads leaves PyTorch's second
        OpenMP thread spinning, on the core the next session call needs: an answerai-colbert
        query 28.2 ms against 15.0 on one thread (2-core Zen 2, torch imported before
        embedserve, so at OpenMP's default spin); SPLADE's vocabulary projection wants both
        (corpus 13.8 against 9.8 texts/s on one; ad-hoc probes)."""
        dev = {
            k: torch.from_numpy(getattr(batch, k)).to(hidden.device)
            for k in ("input_ids", "positions", "seq_ids")
        }
        seqlens = tuple(batch.seqlens.tolist())
        with (
            nullcontext()
            if threads is None or self.VOCABULARY_PROJECTION
            else threads(batch.num_tokens)
        ):
            return self(
                hidden, dev["input_ids"], dev["positions"], dev["seq_ids"], seqlens, outputs, query
            )


def build_retrieval(spec: ModelSpec, weights: FolderWeights | None = None) -> RetrievalHeads | None:
    """The heads of a sparse or multi-vector model (its kind's row names the class, built from
    the spec and `weights`, by default a reader of its own), their multi-vector width checked
    against the folder's; None for a dense-only model."""
    if spec.retrieval is None:
        return None
    module, _, name = KIND_BY_NAME[spec.retrieval.kind].heads.partition(":")
    heads = getattr(importlib.import_module(module), name)(spec, weights or FolderWeights(spec))
    if not isinstance(heads, RetrievalHeads):
        raise TypeError(f"{module}:{name} is not a RetrievalHeads")
    hidden = spec.config.hidden_size
    if heads.token_head is not None:
        heads.multivector_dims = int(heads.token_head(torch.zeros(1, hidden)).shape[-1])
    if heads.multivector_dims != spec.retrieval.multivector_dims:
        raise ModelLoadError(
            f"{spec.path}: the multi-vector head gives {heads.multivector_dims} dims, not the "
            f"{spec.retrieval.multivector_dims} the folder declares (bge-m3: colbert_linear.pt is "
            "hidden -> hidden)"
        )
    return heads


class VisibleKeys:
    """Attention in which sequence i's queries see only its first `visible[i]` keys: a ColBERT
    query's expansion tokens read the query but no token reads them (PyLate's attention mask of
    0 on them, unless `attend_to_expansion_tokens`). One SDPA per sequence, as `sdpa_loop`.
    An executor that holds its own attention (ONNX Runtime's graph, `onnx_encoder`) reads
    `visible` and limits its keys itself."""

    def __init__(self, visible: Sequence[int]) -> None:
        self.visible = tuple(int(m) for m in visible)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layout: RaggedLayout,
        causal: bool,
        window: int | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if causal or window is not None or bias is not None:
            raise ValueError("query expansion runs bidirectional encoders without windows")
        out = torch.empty_like(q)
        start = 0
        for n, m in zip(layout.seqlens, self.visible, strict=True):
            qs = q[None, start : start + n].transpose(1, 2)
            ks, vs = (t[None, start : start + m].transpose(1, 2) for t in (k, v))
            out[start : start + n] = F.scaled_dot_product_attention(qs, ks, vs)[0].transpose(0, 1)
            start += n
        return out
