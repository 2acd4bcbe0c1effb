"""Multi-vector (late-interaction) outputs: one unit vector per kept token of each input, packed
back to back with per-input offsets, never padded.

- bge-m3: `colbert_linear` over every token after the first (CLS) of each input, normalized
  (FlagEmbedding's `colbert_vecs`: the final EOS included).
- ColBERT (PyLate): the Dense projection over each kept token, normalized: a query keeps all its
  tokens (its marker and expansion tokens included), a document drops the skip-list's tokens
  (punctuation).

The projection runs only on the kept tokens, in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TokenVectors:
    """Input i's vectors are `vectors[offsets[i]:offsets[i + 1]]` ([tokens, dims] float32)."""

    offsets: np.ndarray  # [S + 1] int64
    vectors: np.ndarray  # [N, D] float32

    def row(self, i: int) -> np.ndarray:
        return self.vectors[int(self.offsets[i]) : int(self.offsets[i + 1])]


def token_vectors(
    hidden: torch.Tensor,  # [T, H]
    keep: torch.Tensor,  # [T] bool: the tokens that get a vector
    seq_ids: torch.Tensor,  # [T]
    projection: nn.Module,  # [K, H] -> [K, D]
    num_seqs: int,
) -> TokenVectors:
    vectors = F.normalize(projection(hidden[keep].float()), dim=-1)
    counts = torch.bincount(seq_ids[keep], minlength=num_seqs).cpu().numpy()
    offsets = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return TokenVectors(offsets, vectors.cpu().numpy())


def after_first(positions: torch.Tensor) -> torch.Tensor:
    """[T] bool: every token but the first of its input (bge-m3 skips CLS)."""
    return positions != 0


def not_skipped(input_ids: torch.Tensor, skiplist: torch.Tensor) -> torch.Tensor:
    """[T] bool: the tokens not in a document's skip-list."""
    return ~torch.isin(input_ids, skiplist)
