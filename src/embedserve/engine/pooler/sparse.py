"""Sparse (lexical) vectors from the token states of a packed batch, pooled and thresholded on the
device: what leaves is each input's non-zero vocabulary entries, never a vocabulary-wide row.

- SPLADE: the masked-LM head's logits per token, log(1 + ReLU(x)) (log1p once more for
  `log1p_relu`), max (or sum) over the tokens of each input. The [T, V] logits of a whole batch
  (8,192 x 30,522 floats = 1 GB) are never materialized: tokens go through the vocabulary
  projection `SPLADE_BLOCK_TOKENS` at a time, each block reduced per sequence at once, a sequence
  cut by a block boundary carried as one row into the next block.
- bge-m3: ReLU(sparse_linear(h)) per token, the largest weight per (input, token id), the
  tokenizer's CLS / EOS / PAD / UNK dropped, only weights > 0 kept (FlagEmbedding's
  `lexical_weights`).

Shapes: T tokens, S sequences, H hidden, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Tokens per block of the vocabulary projection: 512 x 30,522 fp32 logits = 62.5 MB, whatever
# the batch's size (a whole 8,192-token batch would be 1 GB).
SPLADE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class SparseRows:
    """Sparse vectors of S inputs, row by row (CSR): input i's entries are
    `indices[offsets[i]:offsets[i + 1]]` (ascending token ids) and the same range of `values`."""

    offsets: np.ndarray  # [S + 1] int64
    indices: np.ndarray  # [nnz] int64
    values: np.ndarray  # [nnz] float32

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.indices[a:b], self.values[a:b]

    @classmethod
    def from_parts(cls, seqs: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, n: int):  # type: ignore[no-untyped-def]
        """From (sequence, token id, value) triples sorted by sequence then id."""
        counts = torch.bincount(seqs, minlength=n).cpu().numpy()
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(offsets, indices.cpu().numpy().astype(np.int64), values.float().cpu().numpy())


class SpladeHead(nn.Module):
    """BERT's masked-LM head (dense, GELU, LayerNorm, the decoder tied to the word embeddings)
    and SPLADE's activation and pooling, block by block."""

    def __init__(
        self, hidden: int, vocab: int, eps: float, pooling: str, activation: str, act: str
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.decoder = nn.Linear(hidden, vocab)
        self.gelu = nn.GELU(
            approximate="tanh" if act in ("gelu_new", "gelu_pytorch_tanh") else "none"
        )
        self.pooling = pooling
        self.twice = activation == "log1p_relu"
        self.block = SPLADE_BLOCK_TOKENS

    def activations(self, h: torch.Tensor) -> torch.Tensor:  # [B, H] -> [B, V] float32
        x = self.norm(self.gelu(self.dense(h.float())))
        out = self.decoder(x).relu_().log1p_()  # in place: one [B, V] buffer per block
        return out.log1p_() if self.twice else out

    def forward(self, hidden: torch.Tensor, seqlens: tuple[int, ...]) -> SparseRows:
        total, reduce = hidden.shape[0], "max" if self.pooling == "max" else "sum"
        bounds = np.concatenate([[0], np.cumsum(seqlens)])
        seq_parts: list[torch.Tensor] = []
        idx_parts: list[torch.Tensor] = []
        val_parts: list[torch.Tensor] = []
        carry: torch.Tensor | None = None  # the pooled row of a sequence the last block cut
        for a in range(0, total, self.block):
            b = min(a + self.block, total)
            first = int(np.searchsorted(bounds, a, side="right")) - 1
            last = int(np.searchsorted(bounds, b, side="left")) - 1  # the sequence holding b - 1
            starts = np.maximum(bounds[first : last + 1], a)
            ends = np.minimum(bounds[first + 1 : last + 2], b)
            lengths = torch.as_tensor(ends - starts, device=hidden.device)
            pooled = torch.segment_reduce(self.activations(hidden[a:b]), reduce, lengths=lengths)
            if carry is not None:  # the block's first sequence began in the block before
                pooled[0] = (
                    torch.maximum(pooled[0], carry) if reduce == "max" else pooled[0] + carry
                )
            carry = None
            if bounds[last + 1] > b:  # the last sequence goes on into the next block
                carry, pooled = pooled[-1].clone(), pooled[:-1]
            rows, cols = pooled.nonzero(as_tuple=True)
            seq_parts.append(rows + first)
            idx_parts.append(cols)
            val_parts.append(pooled[rows, cols])
        return SparseRows.from_parts(
            torch.cat(seq_parts), torch.cat(idx_parts), torch.cat(val_parts), len(seqlens)
        )


def lexical_weights(
    weights: torch.Tensor,  # [T] float32: ReLU(sparse_linear(h))
    input_ids: torch.Tensor,  # [T]
    seq_ids: torch.Tensor,  # [T]
    unused_ids: torch.Tensor,  # token ids dropped (CLS, EOS, PAD, UNK)
    vocab: int,
    num_seqs: int,
) -> SparseRows:
    """bge-m3's lexical weights: per input, the largest weight of each token id (> 0, special
    tokens dropped), as FlagEmbedding's `lexical_weights` dicts hold them."""
    keep = (weights > 0) & ~torch.isin(input_ids, unused_ids)
    key = seq_ids[keep] * vocab + input_ids[keep]
    unique, inverse = torch.unique(key, sorted=True, return_inverse=True)
    best = torch.zeros(unique.shape, dtype=weights.dtype, device=weights.device)
    best.scatter_reduce_(0, inverse, weights[keep], "amax", include_self=False)
    return SparseRows.from_parts(unique // vocab, unique % vocab, best, num_seqs)


def relu_weights(linear: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """[T] float32 token weights ReLU(h w + b) of a hidden -> 1 head."""
    return F.relu(linear(hidden.float())).squeeze(-1)
