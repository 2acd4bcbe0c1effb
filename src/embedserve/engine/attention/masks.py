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
- `padded_rows` (padded): sequences gathered into [S, L] rows, a mask over each row's keys, and
  the indices that gather and scatter back.

The forward's layers share one score bias (MPNet's table is computed once per forward), so a
mask is cached by whether it has a bias, not by which.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

import torch

from embedserve.engine.attention.layout import RaggedLayout, Scope

M = TypeVar("M")


def _cached(layout: RaggedLayout, key: Hashable, build: Callable[[], M]) -> M:
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
        near = _distance(n, device).abs() <= window
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

    return _cached(layout, "same-sequence", build)


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
    return _cached(scope.layout, key, build)


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
    return _cached(scope.layout, key, build)


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
    return _cached(layout, key, build)


@dataclass(frozen=True)
class PaddedRows:
    """Sequences gathered into [S, L] rows (L: the layout's `max_seqlen`) inside attention."""

    rows: torch.Tensor  # [S, L] the token index of each row slot (clamped; masked past the end)
    mask: torch.Tensor  # [S, 1, L or 1, L] bool, or [S, N, L, L] float with the bias
    back: tuple[torch.Tensor, torch.Tensor]  # [T] each: token -> (row, slot), to scatter back


def padded_rows(scope: Scope, t: int, dtype: torch.dtype, device: torch.device) -> PaddedRows:
    layout = scope.layout

    def build() -> PaddedRows:
        length = layout.max_seqlen
        cu = layout.cu_seqlens.long()
        starts, lens = cu[:-1], cu[1:] - cu[:-1]  # [S]
        offsets = torch.arange(length, device=device)
        rows = (starts[:, None] + offsets[None, :]).clamp_max(t - 1)
        keep = (offsets[None, :] < lens[:, None])[:, None, None, :]  # [S, 1, 1, L] real keys
        near = allowed(length, device, scope.causal, scope.window, None)
        if near is not None:
            keep = keep & near
        mask = keep if scope.bias is None else additive(keep, scope.bias, length, dtype, device)
        seq_ids = layout.seq_ids
        if seq_ids is None:
            seq_ids = torch.repeat_interleave(
                torch.arange(len(layout.seqlens), device=device), lens
            )
        return PaddedRows(rows, mask, (seq_ids, torch.arange(t, device=device) - starts[seq_ids]))

    key = ("padded", scope.causal, scope.window, scope.bias is not None, dtype)
    return _cached(layout, key, build)
