"""`varlen`: FlashAttention over the ragged batch through `torch.nn.attention.varlen.varlen_attn`
(CUDA only), with a sliding window through the ATen op it wraps. It takes no score bias (the
registry refuses one before it gets here)."""

from __future__ import annotations

import inspect

import torch

from embedserve.engine.attention.layout import Scope
from embedserve.engine.attention.sdpa import expand_kv


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


def varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scope: Scope) -> torch.Tensor:
    if scope.window is not None:
        return _flash_window(q, k, v, scope)
    from torch.nn.attention.varlen import varlen_attn

    gqa = (
        {"enable_gqa": True} if k.shape[1] != q.shape[1] and "enable_gqa" in _VARLEN_PARAMS else {}
    )
    layout = scope.layout
    out = varlen_attn(
        q,
        k,
        v,
        layout.cu_seqlens,
        layout.cu_seqlens,
        layout.max_seqlen,
        layout.max_seqlen,
        **_causal_kwargs(scope.causal),  # type: ignore[arg-type]
        **gqa,  # type: ignore[arg-type]
    )
    assert isinstance(out, torch.Tensor)
    return out


def _flash_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scope: Scope) -> torch.Tensor:
    """FlashAttention over the ragged batch with a sliding window, through the ATen op that
    `varlen_attn` wraps (its window arguments exist on every release; varlen_attn's own keyword
    only on newer ones). Flash windows count keys left and right of the query, inclusive."""
    if k.shape[1] != q.shape[1]:
        k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    layout, window = scope.layout, scope.window
    out = torch.ops.aten._flash_attention_forward(
        q,
        k,
        v,
        layout.cu_seqlens,
        layout.cu_seqlens,
        layout.max_seqlen,
        layout.max_seqlen,
        0.0,
        scope.causal,
        False,
        window_size_left=window,
        window_size_right=0 if scope.causal else window,
    )[0]
    assert isinstance(out, torch.Tensor)
    return out
