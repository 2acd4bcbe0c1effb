"""Shared prefixes of a batch's causal sequences computed once, through every layer (issue 56).

Under causal attention a token's hidden states depend on the tokens before it only, so the
prefix several sequences of one batch share (Qwen3-Reranker's system text, instruction and
query before each document; Qwen3-Embedding's `Instruct: ... Query:` template) gives the same
rows in each of them: the same work done again. `plan` finds the groups of sequences sharing a
prefix of at least `MIN_PREFIX` tokens (sorted by their ids, a group is a run whose common
prefix stays that long), and packs each group's prefix once, followed by each member's own
tokens (its suffix, at its own positions: rotary angles are those of the unfolded sequence).
`attend` is the attention of that packing: a prefix, and a sequence of no group, attends
causally to itself; a suffix to its prefix's keys and then causally to its own. Embeddings,
norms, GEMMs and the MLP are per token, so nothing else changes; each sequence's answer is the
row of its last token (last-token pooling, which a suffix always holds: a prefix stops at least
one token before the end of every member).

Nothing is kept between batches. Bidirectional models are never folded (a prefix token's rows
depend on what follows it there); nor are models pooled otherwise than by their last token.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from embedserve.engine.attention import RaggedLayout
from embedserve.engine.attention.sdpa import expand_kv
from embedserve.engine.batch import PackedBatch

MIN_PREFIX = 16  # tokens: a shorter shared prefix saves less than its gathered keys cost
# a batch is folded when it saves at least this share of its tokens and this many: on a 2-core
# EPYC (bf16, Qwen3-0.6B shapes, benchmarks/studies/prefix_fold.py) 4 instructed queries
# folded (54 tokens saved) ran slower, 5 reranked 634-token pairs (300, 9.5%) 1.04x faster
MIN_SAVED = 0.05
MIN_SAVED_TOKENS = 128


@dataclass(frozen=True)
class Segment:
    """A run of the folded packing: a prefix, a suffix (`prefix`: the (start, length) of the
    prefix it continues) or a whole sequence of no group."""

    start: int
    length: int
    prefix: tuple[int, int] | None = None


@dataclass(frozen=True)
class Fold:
    """A batch folded: its packed ids and positions, the segments, and the index of each
    original sequence's last token in the packing (in the batch's order)."""

    input_ids: np.ndarray  # [T'] int64
    positions: np.ndarray  # [T'] int64
    segments: tuple[Segment, ...]
    last: np.ndarray  # [S] int64
    num_tokens: int  # of the unfolded batch
    masks: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, compare=False)

    @property
    def saved(self) -> float:
        """The share of the batch's tokens not computed."""
        return 1.0 - len(self.input_ids) / max(1, self.num_tokens)


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the common prefix of two id arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def plan(
    batch: PackedBatch, min_prefix: int = MIN_PREFIX, min_saved: float = MIN_SAVED
) -> Fold | None:
    """The batch folded, or None when no group shares `min_prefix` tokens or the fold saves
    less than `min_saved` of its tokens. The batch's positions must restart at 0 in each
    sequence and its token types be 0 (a causal model's batch)."""
    if batch.num_seqs < 2 or batch.token_type_ids.any():
        return None
    bounds = batch.cu_seqlens.tolist()
    seqs = [batch.input_ids[a:b] for a, b in itertools.pairwise(bounds)]
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].tolist())
    groups: list[tuple[list[int], int]] = []  # (members, common prefix) in sorted order
    for i in order:
        if groups:
            members, common = groups[-1]
            shared = min(common, _common(seqs[members[-1]], seqs[i]))
            if shared >= min_prefix:
                groups[-1] = ([*members, i], shared)
                continue
        groups.append(([i], len(seqs[i])))
    ids: list[np.ndarray] = []
    positions: list[np.ndarray] = []
    segments: list[Segment] = []
    last = np.empty(len(seqs), dtype=np.int64)
    at = 0

    def put(i: int, start: int, prefix: tuple[int, int] | None) -> None:
        nonlocal at
        a, b = bounds[i] + start, bounds[i + 1]
        ids.append(batch.input_ids[a:b])
        positions.append(batch.positions[a:b])
        segments.append(Segment(at, b - a, prefix))
        at += b - a
        last[i] = at - 1

    for members, common in groups:
        # every member keeps at least its last token as its own: the pooled row
        shared = min(common, *(len(seqs[i]) - 1 for i in members))
        if len(members) < 2 or shared < min_prefix:
            for i in members:
                put(i, 0, None)
            continue
        first = bounds[members[0]]
        ids.append(batch.input_ids[first : first + shared])
        positions.append(batch.positions[first : first + shared])
        prefix = (at, shared)
        segments.append(Segment(at, shared))
        at += shared
        for i in members:
            put(i, shared, prefix)
    fold = Fold(np.concatenate(ids), np.concatenate(positions), tuple(segments), last,
                batch.num_tokens)  # fmt: skip
    saved = batch.num_tokens - len(fold.input_ids)
    return fold if fold.saved >= min_saved and saved >= MIN_SAVED_TOKENS else None


def attend(fold: Fold) -> Any:
    """The attention of `fold`'s packing (an `AttentionFn`: causal, no window, no bias), one
    SDPA per segment; a suffix's queries see its prefix's keys and then its own, causally (the
    mask of a [n, p + n] block aligned to the bottom right)."""

    def attention(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layout: RaggedLayout,
        causal: bool,
        window: int | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        assert causal and window is None and bias is None, "only causal models are folded"
        k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
        out = torch.empty_like(q)
        for seg in fold.segments:
            s, n = seg.start, seg.length
            qs = q[None, s : s + n].transpose(1, 2)  # [1, N, n, D]
            if seg.prefix is None:
                ks, vs = (t[None, s : s + n].transpose(1, 2) for t in (k, v))
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            else:
                p0, p = seg.prefix
                ks, vs = (
                    torch.cat((t[p0 : p0 + p], t[s : s + n]))[None].transpose(1, 2) for t in (k, v)
                )
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=_mask(fold, n, p, q))
            out[s : s + n] = o[0].transpose(0, 1)
        return out

    return attention


def _mask(fold: Fold, n: int, p: int, like: torch.Tensor) -> torch.Tensor:
    """[n, p + n] bool: query j (at position p + j) sees keys 0 .. p + j; built once a forward."""
    mask = fold.masks.get((n, p))
    if mask is None:
        rows = torch.arange(n, device=like.device)[:, None]
        cols = torch.arange(p + n, device=like.device)[None, :]
        mask = fold.masks[(n, p)] = cols <= rows + p
    return mask


def layout(fold: Fold, device: torch.device) -> RaggedLayout:
    """The packing's segments as a ragged layout (what a model passes to `attend`)."""
    cu = np.zeros(len(fold.segments) + 1, dtype=np.int32)
    cu[1:] = np.cumsum([s.length for s in fold.segments])
    lengths = tuple(s.length for s in fold.segments)
    return RaggedLayout(torch.from_numpy(cu).to(device), max(lengths), lengths)


def run(
    fold: Fold, model: Any, device: torch.device, after_pooling: Any
) -> torch.Tensor:  # [S, H] float32 (or a scoring model's scores)
    """The forward of a folded batch: each sequence's last token's row (then `after_pooling`,
    the Dense modules or the score head, if any), in the batch's order."""
    ids, positions, last = (
        torch.from_numpy(a).to(device) for a in (fold.input_ids, fold.positions, fold.last)
    )
    hidden = model(ids, positions, torch.zeros_like(ids), layout(fold, device), attend(fold))
    pooled = hidden[last].float()
    return pooled if after_pooling is None else after_pooling(pooled)
