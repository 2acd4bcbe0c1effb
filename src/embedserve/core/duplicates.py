"""Identical token sequences of one request embedded once (issue 56): corpora repeat rows (a
public 1.2M-row MiniLM corpus was 37% duplicates) and requests repeat texts. A sequence's vector
does not depend on what it is batched with (tests/engine/test_batch_invariance.py), so the copy
each duplicate gets is the answer it would have had. Identical means the same ids after the
request's prompt and truncation, under the request's one head: the same model, the same options.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def unique_sequences(
    seqs: Sequence[Sequence[int]],
) -> tuple[list[Sequence[int]], np.ndarray | None]:
    """The distinct sequences in first-seen order, and each input's row among them (None: every
    sequence is distinct, nothing to copy)."""
    index: dict[tuple[int, ...], int] = {}
    unique: list[Sequence[int]] = []
    back = np.empty(len(seqs), dtype=np.intp)
    for i, seq in enumerate(seqs):
        row = index.setdefault(tuple(seq), len(unique))
        if row == len(unique):
            unique.append(seq)
        back[i] = row
    return (unique, None) if len(unique) == len(seqs) else (unique, back)
