"""The one mask builder: every attention mask of a forward comes from one rule, is built on first
use and is kept in the layout's cache, so every layer of the forward reuses it.

The rule: a query may attend a key of its own sequence, within `window` of it (|key - query| <=
window), and not after it when attention is causal; with a score bias, the bias at their distance
is added to their score (an additive float mask: 0 or -inf, plus the bias). Each backend takes the
form its kernel wants:

- `sequence_mask` (sdpa_loop): one sequence's [n, n], or None when `is_causal` says it all.
- `block_diagonal` (block_mask): [T, T] over the whole packed batch, sequences never mixing.
- `bucket_mask` (cudnn): as `block_diagonal`, but None or a [T] mask of the padding keys where a
  graph bucket holds one real sequence (`solo`, `dense` layouts), and always additive.
- `padded_blocks` + `block_mask` (padded): sequences gathered into [C, L] rows, block by block
  (each block's slots bounded by the batch's tokens, `padded_bound`), a mask over each row's keys,
  and the indices that gather and scatter back.

Memory is bounded by design: no [T, T] mask above `MAX_MASK_TOKENS` (`needs_square` says where a
backend would build one), and no [S, N, L, L] one over all sequences at once.

The forward's layers share one score bias (MPNet's table is computed once per forward), so a
mask is cached by whether it has a bias, not by which.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from embedserve.engine.attention.layout import RaggedLayout, Scope

M = TypeVar("M")

# A [T, T] mask (block_mask, cudnn over several sequences) is built up to this many tokens; above
# it those backends run `padded`'s bounded form instead (its buffers grow as T, not T²).
MAX_MASK_TOKENS = 2048
# `padded` gathers at most this many row slots per token of the batch into one block.
PADDED_SLOTS_PER_TOKEN = 2


def cached(layout: RaggedLayout, key: Hashable, build: Callable[[], M]) -> M:
    if key not in layout.cache:
        layout.cache[key] = build()
    return layout.cache[key]


def _distance(n: int, device: torch.device) -> torch.Tensor:
    """[n, n]: key index - query index."""
    i = torch.arange(n, device=device)
    return i[None, :] - i[:, None]


def _by_distance(bias: torch.Tensor, n: int) -> torch.Tensor:
    reach = (bias.shape[1] - 1) // 2
    return bias[:, _distance(n, bias.device).clamp(-reach, reach) + reach]


def distance_bias(bias: torch.Tensor, n: int) -> torch.Tensor:
    """[N, n, n]: bias[h, clamp(j - i, -R, R) + R] for query i, key j (see `layout`)."""
    return _by_distance(bias, n)


def allowed(
    n: int, device: torch.device, causal: bool, window: int | None, same: torch.Tensor | None
) -> torch.Tensor | None:
    """[n, n] bool, True where query i may attend key j: `same` (None: any), |i - j| <= window
    (None: any), j <= i when causal; None when nothing is ruled out."""
    keep = same
    if window is not None:
        # NOTE: two bool comparisons, not |j - i| <= window on an int64 [n, n] (and its abs):
        # 1.1 GB for one 8,192-token text
        i = torch.arange(n, device=device)
        near = (i[None, :] <= i[:, None] + window) & (i[None, :] >= i[:, None] - window)
        keep = near if keep is None else keep & near
    if causal:
        before = torch.ones(n, n, dtype=torch.bool, device=device).tril_()
        keep = before if keep is None else keep & before
    return keep


def additive(
    keep: torch.Tensor | None,
    bias: torch.Tensor | None,
    n: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """An SDPA float mask: 0 where `keep` (already in its broadcast shape, [.., n or 1, n];
    None: everywhere), -inf elsewhere, plus the bias at each distance ([.., N, n, n])."""
    if keep is None:
        mask = torch.zeros((1, 1, 1, 1), dtype=dtype, device=device)
    else:
        zero = torch.zeros((), dtype=dtype, device=device)
        mask = torch.where(keep, zero, float("-inf"))
    if bias is not None:
        mask = mask + _by_distance(bias, n).to(dtype)
    return mask


def same_sequence(layout: RaggedLayout, device: torch.device) -> torch.Tensor:
    """[T, T] bool, True where query and key belong to the same sequence (block diagonal)."""

    if layout.mask is not None:
        return layout.mask

    def build() -> torch.Tensor:
        seq_ids = layout.seq_ids  # on the device inside a CUDA graph
        if seq_ids is None:
            seq_ids = torch.repeat_interleave(
                torch.arange(len(layout.seqlens), device=device),
                torch.tensor(layout.seqlens, device=device),
            )
        return seq_ids[:, None] == seq_ids[None, :]

    return cached(layout, "same-sequence", build)


def _cutting(window: int | None, n: int) -> int | None:
    """The window where it rules out a key of n tokens, else None."""
    return window if window is not None and n - 1 > window else None


def sequence_mask(
    scope: Scope, n: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """One sequence of n tokens: None (no bias, no window that cuts: `is_causal` says it all),
    [n, n] bool, or [1, N, n, n] float with the bias."""
    window = _cutting(scope.window, n)
    if scope.bias is None and window is None:
        return None

    def build() -> torch.Tensor:
        keep = allowed(n, device, scope.causal, window, None)
        if scope.bias is None:
            assert keep is not None  # a window cuts
            return keep
        return additive(None if keep is None else keep[None, None], scope.bias, n, dtype, device)

    key = ("sequence", n, scope.causal, window, scope.bias is not None, dtype)
    return cached(scope.layout, key, build)


def block_diagonal(scope: Scope, t: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The whole packed batch of t tokens: [T, T] bool, or [1, N, T, T] float with the bias."""

    def build() -> torch.Tensor:
        same = same_sequence(scope.layout, device)
        keep = allowed(t, device, scope.causal, scope.window, same)
        assert keep is not None
        if scope.bias is None:
            return keep
        return additive(keep[None, None], scope.bias, t, dtype, device)

    key = ("block", scope.causal, scope.window, scope.bias is not None, dtype)
    return cached(scope.layout, key, build)


def square_over_limit(scope: Scope, t: int, *, bucket: bool) -> bool:
    """Whether a whole-batch mask of t tokens would be [T, T] above `MAX_MASK_TOKENS`: always
    for `block_diagonal`; for `bucket_mask` (`bucket`) unless one plain real sequence needs at
    most a [T] mask."""
    if t <= MAX_MASK_TOKENS:
        return False
    layout = scope.layout
    plain = scope.bias is None and _cutting(scope.window, t) is None
    return not (bucket and plain and (layout.dense or layout.solo))


def bucket_mask(
    scope: Scope, t: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """A graph bucket of t tokens, additive: None where one real sequence needs no mask (it fills
    the bucket, or is causal: its padding comes after it, so no real query sees a padding key);
    [1, 1, 1, T] hiding the padding keys of one bidirectional real sequence; else as
    `block_diagonal`, [1, 1 or N, T, T]."""
    layout = scope.layout
    window = _cutting(scope.window, t)
    plain = scope.bias is None and window is None
    if plain and (layout.dense or (layout.solo and scope.causal)):
        return None

    def build() -> torch.Tensor:
        if plain and layout.solo:
            assert layout.seq_ids is not None, "a solo layout carries seq_ids"
            return additive((layout.seq_ids == 0)[None, None, None], None, t, dtype, device)
        same = None if layout.dense else same_sequence(layout, device)
        keep = allowed(t, device, scope.causal, window, same)
        return additive(None if keep is None else keep[None, None], scope.bias, t, dtype, device)

    key = ("bucket", scope.causal, window, scope.bias is not None, dtype)
    return cached(layout, key, build)


@dataclass(frozen=True)
class PaddedBlock:
    """Some sequences gathered into [C, L] rows inside attention (`padded`)."""

    rows: torch.Tensor  # [C, L] the token index of each row slot (clamped; masked past the end)
    keep: torch.Tensor  # [C, 1, 1, L] bool: the slot holds a real key of the row's sequence
    dst: (
        torch.Tensor
    )  # [C, L] where each slot's output goes: its token, or T (dropped) past the end

    @property
    def length(self) -> int:
        return int(self.rows.shape[1])


def padded_bound(t: int, length: int, heads: int, head_dim: int) -> int:
    """Elements of the largest buffer `padded` builds for t tokens whose rows are `length` long:
    a block holds at most PADDED_SLOTS_PER_TOKEN * max(t, length) row slots, so its mask (and
    SDPA's scores) [C, N, L, L] and its gathers [C, N, L, D] stay within this."""
    return heads * PADDED_SLOTS_PER_TOKEN * max(t, length) * max(length, head_dim)


def padded_blocks(scope: Scope, t: int, device: torch.device) -> tuple[PaddedBlock, ...]:
    """The rows of a forward, in blocks of at most `PADDED_SLOTS_PER_TOKEN * max(t, L)` slots.

    With the host's lengths (eager), sequences are grouped by length (sorted, so a long one does
    not pad thousands of short ones to its length) and each block is as long as its longest.
    Inside a CUDA graph (no host lengths) every row is the bucket's `max_seqlen` long and the
    blocks are runs of sequences in order: shapes fixed by the bucket alone."""
    layout = scope.layout

    def build() -> tuple[PaddedBlock, ...]:
        cu = layout.cu_seqlens.long()
        starts, lens = cu[:-1], cu[1:] - cu[:-1]  # [S]
        if layout.seqlens:
            groups = _length_groups(layout.seqlens, t)
            index = torch.from_numpy(np.concatenate([g for g, _ in groups])).to(device)
            sizes = [len(g) for g, _ in groups]
            picks = zip(torch.split(index, sizes), (n for _, n in groups), strict=True)
        else:
            length = layout.max_seqlen
            per = max(1, PADDED_SLOTS_PER_TOKEN * max(t, length) // length)
            seqs = torch.arange(starts.shape[0], device=device)
            picks = zip(torch.split(seqs, per), itertools.repeat(length))
        return tuple(_block(starts[g], lens[g], n, t, device) for g, n in picks)

    return cached(layout, "padded-blocks", build)


def _length_groups(seqlens: tuple[int, ...], t: int) -> list[tuple[np.ndarray, int]]:
    """(sequence indices, row length) per block: sorted by length, each block grown while its
    rows times its longest stay within the slot budget."""
    lens = np.asarray(seqlens)
    order = np.argsort(lens, kind="stable")
    budget = PADDED_SLOTS_PER_TOKEN * max(t, int(lens.max()))
    groups: list[tuple[np.ndarray, int]] = []
    first = 0
    for i in range(1, len(order) + 1):
        if i == len(order) or (i - first + 1) * int(lens[order[i]]) > budget:
            groups.append((order[first:i], int(lens[order[i - 1]])))
            first = i
    return groups


def _block(
    starts: torch.Tensor, lens: torch.Tensor, length: int, t: int, device: torch.device
) -> PaddedBlock:
    offsets = torch.arange(length, device=device)
    tokens = starts[:, None] + offsets[None, :]
    real = offsets[None, :] < lens[:, None]  # [C, L]
    dst = torch.where(real, tokens, torch.full_like(tokens, t))
    return PaddedBlock(tokens.clamp_max(t - 1), real[:, None, None, :], dst)


def block_mask(
    scope: Scope, block: PaddedBlock, dtype: torch.dtype, device: torch.device, *, keep: bool
) -> torch.Tensor:
    """One block's mask: [C, 1, 1 or L, L] bool, or [C, N, L, L] float with the bias; kept in
    the layout's cache for the forward's other layers when `keep`."""

    def build() -> torch.Tensor:
        length = block.length
        real = block.keep
        near = allowed(length, device, scope.causal, scope.window, None)
        if near is not None:
            real = real & near
        return real if scope.bias is None else additive(real, scope.bias, length, dtype, device)

    if not keep:
        return build()
    key = ("padded", scope.causal, scope.window, scope.bias is not None, dtype)
    return cached(scope.layout, key, build)
