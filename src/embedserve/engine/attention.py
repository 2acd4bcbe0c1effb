"""Attention over a packed ragged batch, behind one signature and a registry of backends.

Every backend takes q, k, v as [T, N, D] (T = tokens of all sequences back to back) and the
sequence boundaries in a `RaggedLayout`; none pads sequences to a common length.

- `varlen`: FlashAttention through `torch.nn.attention.varlen.varlen_attn` (CUDA only).
- `sdpa_loop`: one `scaled_dot_product_attention` per sequence (CPU default: measured fastest on a
  2-core CPU for mixed lengths, see docs/architecture.md).
- `block_mask`: one SDPA over the whole batch with a block-diagonal boolean mask. Its cost grows
  with T², so it only wins for many tiny sequences.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class RaggedLayout:
    """Where each sequence starts and ends in the packed token dimension."""

    cu_seqlens: torch.Tensor  # [S + 1] int32, on the model's device
    max_seqlen: int
    seqlens: tuple[int, ...]  # host copy, for backends that loop over sequences
    # [T] int64 on the device: set inside CUDA graphs, where no host value may change between
    # replays (then `seqlens` is empty and `max_seqlen` is the bucket's bound, not the batch's)
    seq_ids: torch.Tensor | None = None


# (q, k, v, layout, causal) -> [T, N, D]
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, RaggedLayout, bool], torch.Tensor]


def _expand_kv(k: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """Repeat grouped key/value heads so every query head has its own (GQA on the SDPA paths)."""
    if k.shape[1] == num_q_heads:
        return k
    groups = num_q_heads // k.shape[1]
    return k.repeat_interleave(groups, dim=1)


def sdpa_loop(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: RaggedLayout, causal: bool
) -> torch.Tensor:
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    out = torch.empty_like(q)
    start = 0
    for n in layout.seqlens:
        end = start + n
        # [1, N, n, D] views of this sequence only. NOTE: 4-D inputs matter: with 3-D ones
        # PyTorch's CPU dispatcher falls back to the unfused math kernel, 4x slower.
        qs, ks, vs = (t[None, start:end].transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        out[start:end] = o[0].transpose(0, 1)
        start = end
    return out


def block_mask(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: RaggedLayout, causal: bool
) -> torch.Tensor:
    seq_ids = layout.seq_ids  # on the device inside a CUDA graph
    if seq_ids is None:
        seq_ids = torch.repeat_interleave(
            torch.arange(len(layout.seqlens), device=q.device),
            torch.tensor(layout.seqlens, device=q.device),
        )
    mask = seq_ids[:, None] == seq_ids[None, :]  # [T, T] block diagonal
    if causal:
        mask &= torch.ones_like(mask).tril_()
    gqa: dict[str, bool] = {}
    if k.shape[1] != q.shape[1]:
        if q.device.type == "cuda":
            gqa = {"enable_gqa": True}  # no copy of K and V per query head
        else:
            k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    out = F.scaled_dot_product_attention(
        q[None].transpose(1, 2),
        k[None].transpose(1, 2),
        v[None].transpose(1, 2),
        attn_mask=mask,
        **gqa,
    )
    return out[0].transpose(0, 1)


def _varlen_params() -> frozenset[str]:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # pragma: no cover - older torch
        return frozenset()
    return frozenset(inspect.signature(varlen_attn).parameters)


# NOTE: varlen_attn's keywords differ between releases (2.11: is_causal and no GQA switch, the
# K/V heads go to the kernel as they are; 2.13: window_size and enable_gqa); adapt at import.
# GQA against an SDPA reference on the device: tests/engine/test_graphs_gpu.py.
_VARLEN_PARAMS = _varlen_params()


def _causal_kwargs(causal: bool) -> dict[str, object]:
    if "is_causal" in _VARLEN_PARAMS:
        return {"is_causal": causal}
    return {"window_size": (-1, 0) if causal else (-1, -1)}


def varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: RaggedLayout, causal: bool
) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    gqa = (
        {"enable_gqa": True} if k.shape[1] != q.shape[1] and "enable_gqa" in _VARLEN_PARAMS else {}
    )
    out = varlen_attn(
        q,
        k,
        v,
        layout.cu_seqlens,
        layout.cu_seqlens,
        layout.max_seqlen,
        layout.max_seqlen,
        **_causal_kwargs(causal),  # type: ignore[arg-type]
        **gqa,  # type: ignore[arg-type]
    )
    assert isinstance(out, torch.Tensor)
    return out


BACKENDS: dict[str, AttentionFn] = {
    "varlen": varlen,
    "sdpa_loop": sdpa_loop,
    "block_mask": block_mask,
}


# Backends that read no host value that changes between batches once `seq_ids` is set: the
# only ones a CUDA graph may capture.
CAPTURE_SAFE: tuple[str, ...] = ("varlen", "block_mask")


def choose_backend(name: str | None, device: torch.device) -> AttentionFn:
    """The named backend, or the measured default for the device."""
    if name is None or name == "auto":
        name = "varlen" if device.type == "cuda" else "sdpa_loop"
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {', '.join(BACKENDS)}")
    if name == "varlen" and device.type != "cuda":
        raise ValueError("attention backend 'varlen' needs a CUDA device")
    return BACKENDS[name]
