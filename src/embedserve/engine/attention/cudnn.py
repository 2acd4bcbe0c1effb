"""`cudnn`: one SDPA over the whole bucket restricted to cuDNN's fused attention (on Hopper much
faster than FlashAttention-2 at long T). With one real sequence (`solo`: a single text, the
latency case) no [T, T] mask: none when it fills the bucket (`dense`) or attention is causal (the
padding comes after it, so it never sees it), else a [T] mask of the padding keys. With several
sequences, the block-diagonal mask, so padding and dummy sequences never mix with a real one (the
masks are `masks.bucket_mask`'s; above `masks.MAX_MASK_TOKENS` tokens such a [T, T] mask is never
built: `sdpa.padded` runs instead). On the CPU plain SDPA (for tests).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from embedserve.engine.attention import masks, sdpa
from embedserve.engine.attention.layout import Scope
from embedserve.engine.attention.sdpa import expand_kv


def cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scope: Scope) -> torch.Tensor:
    """`choices.cudnn_gqa` (whether cuDNN takes grouped K/V heads) is learned on the first call
    with grouped heads, which is never inside a capture (a bucket's first hit runs eagerly, and
    every capture is preceded by a warm-up run)."""
    if masks.square_over_limit(scope, q.shape[0], bucket=True):
        return sdpa.padded(q, k, v, scope)  # bounded: no [T, T] mask above MAX_MASK_TOKENS
    choices = scope.choices
    mask = masks.bucket_mask(scope, q.shape[0], q.dtype, q.device)
    on_cuda = q.device.type == "cuda"
    grouped = k.shape[1] != q.shape[1]
    if grouped and not (on_cuda and choices.cudnn_gqa is not False):
        k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    q4, k4, v4 = (t[None].transpose(1, 2) for t in (q, k, v))  # [1, N, T, D] views
    kwargs: dict[str, object] = {"attn_mask": mask, "is_causal": scope.causal and mask is None}
    if not on_cuda:
        out = F.scaled_dot_product_attention(q4, k4, v4, **kwargs)  # type: ignore[arg-type]
        return out[0].transpose(0, 1)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        if grouped and choices.cudnn_gqa is not False:
            try:
                out = F.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True, **kwargs)  # type: ignore[arg-type]
                choices.cudnn_gqa = True
            except RuntimeError:
                if choices.cudnn_gqa:  # it worked before: a real error
                    raise
                # maybe no grouped heads in cuDNN: once more with K/V expanded (if this fails
                # too, something else is wrong and nothing is learned)
                ke, ve = (expand_kv(t, q.shape[1])[None].transpose(1, 2) for t in (k, v))
                out = F.scaled_dot_product_attention(q4, ke, ve, **kwargs)  # type: ignore[arg-type]
                choices.cudnn_gqa = False
        else:
            out = F.scaled_dot_product_attention(q4, k4, v4, **kwargs)  # type: ignore[arg-type]
    return out[0].transpose(0, 1)
