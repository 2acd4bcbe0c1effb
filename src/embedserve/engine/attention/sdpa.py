"""The attention backends built on `scaled_dot_product_attention` over a packed batch, each with
the mask form it needs from `masks` (built once per forward):

- `sdpa_loop`: one SDPA per sequence (CPU default: measured fastest on a 2-core CPU for mixed
  lengths, see docs/architecture.md).
- `block_mask`: one SDPA over the whole batch with a block-diagonal boolean mask. Its cost grows
  with T², so it only wins for many tiny sequences.
- `padded`: the sequences gathered into [C, L] rows (L: a block's longest, or the layout's
  max_seqlen in a graph), one SDPA per block with a key-padding mask, scattered back. Padding
  inside attention only (never in the GEMMs): the backend for models whose score bias
  FlashAttention cannot take (MPNet), where a [T, T] mask over a whole bucket would cost T²
  instead of S L². Blocks hold at most 2 max(T, L) slots (`masks.padded_bound`), so one long
  text among thousands of short ones never pads them all to its length.

`block_mask` (and `cudnn`) above `masks.MAX_MASK_TOKENS` tokens run `padded` instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from embedserve.engine.attention import masks
from embedserve.engine.attention.layout import Scope


def expand_kv(k: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """Repeat grouped key/value heads so every query head has its own (GQA on the SDPA paths)."""
    if k.shape[1] == num_q_heads:
        return k
    groups = num_q_heads // k.shape[1]
    return k.repeat_interleave(groups, dim=1)


def sdpa_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scope: Scope) -> torch.Tensor:
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    out = torch.empty_like(q)
    start = 0
    for n in scope.layout.seqlens:
        end = start + n
        # [1, N, n, D] views of this sequence only. NOTE: 4-D inputs matter: with 3-D ones
        # PyTorch's CPU dispatcher falls back to the unfused math kernel, 4x slower.
        qs, ks, vs = (t[None, start:end].transpose(1, 2) for t in (q, k, v))
        mask = masks.sequence_mask(scope, n, q.dtype, q.device)
        if mask is None:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=scope.causal)
        else:
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)
        out[start:end] = o[0].transpose(0, 1)
        start = end
    return out


def block_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scope: Scope) -> torch.Tensor:
    if masks.square_over_limit(scope, q.shape[0], bucket=False):
        return padded(q, k, v, scope)  # bounded: no [T, T] mask above MAX_MASK_TOKENS
    mask = masks.block_diagonal(scope, q.shape[0], q.dtype, q.device)
    gqa: dict[str, bool] = {}
    if k.shape[1] != q.shape[1]:
        if q.device.type == "cuda":
            gqa = {"enable_gqa": True}  # no copy of K and V per query head
        else:
            k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    out = F.scaled_dot_product_attention(
        q[None].transpose(1, 2),
        k[None].transpose(1, 2),
        v[None].transpose(1, 2),
        attn_mask=mask,
        **gqa,
    )
    return out[0].transpose(0, 1)


def padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scope: Scope) -> torch.Tensor:
    """Block by block (`masks.padded_blocks`): gather the rows, one SDPA, and each real slot's
    output copied to its token (padding slots go to row T, dropped)."""
    t = q.shape[0]
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    blocks = masks.padded_blocks(scope, t, q.device)
    out = q.new_empty((t + 1, *q.shape[1:]))
    for block in blocks:
        # one block: its mask is kept for every layer of the forward; several: each is built
        # when used, so only one block's is alive at a time
        mask = masks.block_mask(scope, block, q.dtype, q.device, keep=len(blocks) == 1)
        qp, kp, vp = (x[block.rows].transpose(1, 2) for x in (q, k, v))  # [C, N, L, D]
        o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)
        out.index_copy_(0, block.dst.flatten(), o.transpose(1, 2).flatten(0, 1))
    return out[:t]
