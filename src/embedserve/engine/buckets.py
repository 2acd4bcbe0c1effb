"""The bucket arithmetic of the CUDA graphs: where a batch is padded to, and its padded inputs.

A batch is padded up to a bucket: its token count to a multiple of 64 (of 256 above 1,024), its
sequence count to a power of two, and its longest sequence to a power of two (at least 64), which
is the `max_seqlen` the attention kernel is given. The padding tokens form dummy sequences after
the real ones, and empty sequences fill the sequence bucket; their pooled rows are never returned.
Pure NumPy: the graphs (`graphs.GraphRunner`) own the device side.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from embedserve.engine.batch import PackedBatch


class BucketBounds(Protocol):
    """The largest buckets (`graphs.GraphConfig` has them): read here, owned there, so the
    arithmetic needs nothing of the device side."""

    @property
    def max_tokens(self) -> int: ...

    @property
    def max_seqs(self) -> int: ...


SMALL_TOKENS = 1024  # up to here token buckets step by 64, above by 256
MIN_SEQLEN_BUCKET = 64
# the token counts of the short queries a start-up warm-up is made of (a search query of a few
# words with its special tokens)
SHORT_QUERY_TOKENS = tuple(range(5, 21))


def token_bucket(num_tokens: int, max_tokens: int) -> int | None:
    """The padded token count for a batch, or None when it is above the largest bucket."""
    step = 64 if num_tokens <= SMALL_TOKENS else 256
    bucket = max(step, -(-num_tokens // step) * step)
    return bucket if bucket <= max_tokens else None


def seq_bucket(num_seqs: int, max_seqs: int) -> int | None:
    """The padded sequence count (a power of two, at least 2), or None above `max_seqs`."""
    bucket = 1 << max(1, (num_seqs - 1).bit_length())
    return bucket if bucket <= max_seqs else None


def seqlen_bucket(max_seqlen: int, num_tokens: int) -> int:
    """The `max_seqlen` a graph is captured with: a power of two, at most the token bucket."""
    return min(num_tokens, 1 << max(MIN_SEQLEN_BUCKET - 1, max_seqlen - 1).bit_length())


@dataclass(frozen=True)
class BucketPlan:
    num_tokens: int  # padded T
    num_seqs: int  # padded S, dummy and empty sequences included
    max_seqlen: int  # bound on every sequence, dummies included
    pad_seqlens: tuple[int, ...]  # lengths of the dummy sequences that hold the padding tokens
    # exactly one real sequence (padding after it or not): attention needs at most a mask of the
    # padding keys, not a block-diagonal one, so the dense kernels serve real lengths too
    solo: bool = False
    # solo and no padding: attention over the bucket needs no mask at all
    dense: bool = False

    @property
    def key(self) -> str:
        # NOTE: the layout flags are part of the key, so a graph captured for a solo (or dense)
        # batch only ever replays for such batches
        suffix = "-d" if self.dense else "-1" if self.solo else ""
        return f"t{self.num_tokens}-s{self.num_seqs}-l{self.max_seqlen}{suffix}"

    @property
    def staged_size(self) -> int:
        """int64 elements of the staged inputs: ids, positions, types, seq_ids, cu_seqlens."""
        return 4 * self.num_tokens + self.num_seqs + 1


def plan_bucket(
    seqlens: Sequence[int] | np.ndarray, config: BucketBounds, max_positions: int
) -> BucketPlan | None:
    """Where a batch with these sequence lengths is padded to, or None if no bucket holds it."""
    num_tokens = int(np.sum(seqlens))
    tokens = token_bucket(num_tokens, config.max_tokens)
    if tokens is None:
        return None
    max_seqlen = seqlen_bucket(int(np.max(seqlens)), tokens)
    # NOTE: a dummy sequence is also bounded by the position table: its positions count from 0.
    dummy = min(max_seqlen, max_positions)  # the longest dummy sequence
    pad = tokens - num_tokens
    pads = (dummy,) * (pad // dummy) + ((pad % dummy,) if pad % dummy else ())
    seqs = seq_bucket(len(seqlens) + len(pads), config.max_seqs)
    if seqs is None:
        return None
    solo = len(seqlens) == 1
    return BucketPlan(tokens, seqs, max_seqlen, pads, solo=solo, dense=solo and not pads)


def short_query_batches(
    max_queries: int, config: BucketBounds, max_positions: int
) -> list[np.ndarray]:
    """Sequence lengths of one batch per bucket that batches of 1 to `max_queries` short queries
    (`SHORT_QUERY_TOKENS` each) fall into, in order of first appearance: what a server captures
    at start-up so that its first clients do not wait for captures. Every total a count of such
    queries can have is tried (the bucket follows from the count and the total alone)."""
    found: dict[str, np.ndarray] = {}
    low, high = SHORT_QUERY_TOKENS[0], SHORT_QUERY_TOKENS[-1]
    for n in range(1, max_queries + 1):
        for total in range(low * n, high * n + 1):
            seqlens = np.full(n, total // n)
            seqlens[: total % n] += 1
            plan = plan_bucket(seqlens, config, max_positions)
            if plan is not None and plan.key not in found:
                found[plan.key] = seqlens
    return list(found.values())


def grid_parts(
    seqlens: np.ndarray, config: BucketBounds, max_positions: int
) -> list[tuple[int, int]]:
    """[start, stop) runs of sequences, in order, each held by a bucket (a sequence longer than
    the largest bucket alone in its run): how a batch above the grid is split, so no batch runs
    eagerly at more tokens than the grid's (and attention's buffers stay bounded by them)."""
    cu = np.concatenate([[0], np.cumsum(seqlens, dtype=np.int64)])
    parts: list[tuple[int, int]] = []
    start, n = 0, len(seqlens)
    while start < n:
        # the most sequences whose tokens and count fit, then fewer while padding's dummy
        # sequences push the plan over the sequence bucket
        fit = int(np.searchsorted(cu, cu[start] + config.max_tokens, side="right")) - 1
        stop = max(start + 1, min(fit, start + config.max_seqs, n))
        while stop > start + 1 and plan_bucket(seqlens[start:stop], config, max_positions) is None:
            stop -= 1
        parts.append((start, stop))
        start = stop
    return parts


@functools.lru_cache(maxsize=4096)
def _pad_tail(plan: BucketPlan, num_seqs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions, seq ids) of the padding tokens and cu_seqlens after the real sequences, for a
    batch of `num_seqs` real sequences in `plan`: the same for every such batch, built once."""
    t, s = plan.num_tokens, plan.num_seqs
    pad = sum(plan.pad_seqlens)
    pos = np.empty(pad, dtype=np.int64)
    sids = np.empty(pad, dtype=np.int64)
    cu = np.full(s - num_seqs, t, dtype=np.int64)  # cu[num_seqs + 1 :]
    start, seq = 0, num_seqs
    for i, length in enumerate(plan.pad_seqlens):
        pos[start : start + length] = np.arange(length)
        sids[start : start + length] = seq
        start += length
        seq += 1
        cu[i] = t - pad + start
    for a in (pos, sids, cu):
        a.flags.writeable = False
    return pos, sids, cu


def stage_inputs(batch: PackedBatch, plan: BucketPlan, out: np.ndarray) -> None:
    """Write the padded inputs of `batch` into `out[:plan.staged_size]` (int64).

    Layout: ids [T] | positions [T] | token types [T] | seq_ids [T] | cu_seqlens [S + 1].
    Padding tokens are id 0 with positions restarting at 0 in each dummy sequence.
    """
    t, s, n = plan.num_tokens, plan.num_seqs, batch.num_tokens
    if n + sum(plan.pad_seqlens) != t:
        raise ValueError(f"plan for {t} tokens does not fit a batch of {n} tokens")
    ids, pos, types, sids = (out[i * t : (i + 1) * t] for i in range(4))
    cu = out[4 * t : 4 * t + s + 1]
    pad_pos, pad_sids, cu_tail = _pad_tail(plan, batch.num_seqs)
    ids[:n] = batch.input_ids
    ids[n:] = 0
    pos[:n] = batch.positions
    pos[n:] = pad_pos
    types[:n] = batch.token_type_ids
    types[n:] = 0
    sids[:n] = batch.seq_ids
    sids[n:] = pad_sids
    cu[: batch.num_seqs + 1] = batch.cu_seqlens
    cu[batch.num_seqs + 1 :] = cu_tail  # dummy sequences, then empty ones up to the bucket
