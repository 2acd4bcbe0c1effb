"""Attention over a packed ragged batch, behind one signature and a registry of backends.

Every backend takes q, k, v as [T, N, D] (T = tokens of all sequences back to back) and the
sequence boundaries in a `RaggedLayout`; none pads sequences to a common length.

- `varlen`: FlashAttention through `torch.nn.attention.varlen.varlen_attn` (CUDA only).
- `sdpa_loop`: one `scaled_dot_product_attention` per sequence (CPU default: measured fastest on a
  2-core CPU for mixed lengths, see docs/architecture.md).
- `block_mask`: one SDPA over the whole batch with a block-diagonal boolean mask. Its cost grows
  with T², so it only wins for many tiny sequences.
- `padded`: the sequences gathered into [S, L] rows (L: the layout's max_seqlen), one SDPA with
  a key-padding mask, scattered back. Padding inside attention only (never in the GEMMs): the
  backend for models whose score bias FlashAttention cannot take (MPNet), where a [T, T] mask
  over a whole bucket would cost T² instead of S L².
- `cudnn`: one SDPA over the whole bucket restricted to cuDNN's fused attention (on Hopper much
  faster than FlashAttention-2 at long T). With one real sequence (`solo`: a single text, the
  latency case) no [T, T] mask: none when it fills the bucket (`dense`) or attention is causal
  (the padding comes after it, so it never sees it), else a [T] mask of the padding keys. With
  several sequences, the block-diagonal mask, so padding and dummy sequences never mix with a
  real one. On the CPU plain SDPA (for tests).

Every backend also takes `window`: None (every key of the sequence), or a sliding window, the
largest distance |query - key| a query may attend over (ModernBERT's local layers: 64; a
bidirectional Gemma3's sliding layers: `sliding_window // 2`). Within one packed sequence the
distance of positions is the distance of token indices, so the window is a band on the packed
dimension intersected with the sequence's block.

And `bias`: None, or a per-head additive score bias by distance (MPNet's relative positions):
[N, 2R + 1], the entry for key - query distance d at column clamp(d, -R, R) + R. FlashAttention
takes no such bias, so `varlen` refuses it; the SDPA backends add it to their mask.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from embedserve.engine.choices import KernelChoices


@dataclass(frozen=True)
class RaggedLayout:
    """Where each sequence starts and ends in the packed token dimension."""

    cu_seqlens: torch.Tensor  # [S + 1] int32, on the model's device
    max_seqlen: int
    seqlens: tuple[int, ...]  # host copy, for backends that loop over sequences
    # [T] int64 on the device: set inside CUDA graphs, where no host value may change between
    # replays (then `seqlens` is empty and `max_seqlen` is the bucket's bound, not the batch's)
    seq_ids: torch.Tensor | None = None
    # exactly one sequence covering all T tokens (no padding): attention needs no mask
    dense: bool = False
    # [T, T] bool block-diagonal mask built once per forward from `seq_ids` (mask backends)
    mask: torch.Tensor | None = None
    # per-forward values a backend derives once and every layer reuses (cuDNN's additive bias)
    cache: dict[str, torch.Tensor] = field(default_factory=dict, compare=False)
    # exactly one real sequence, at the front (sequence 0), the rest padding; `dense` implies it
    solo: bool = False


class AttentionFn(Protocol):
    """(q, k, v, layout, causal, window) -> [T, N, D]; see the module docstring."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layout: RaggedLayout,
        causal: bool,
        window: int | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


def band(n: int, window: int, device: torch.device) -> torch.Tensor:
    """[n, n] bool, True where |i - j| <= window (a sliding window over token indices)."""
    i = torch.arange(n, device=device)
    return (i[:, None] - i[None, :]).abs() <= window


def distance_bias(bias: torch.Tensor, n: int) -> torch.Tensor:
    """[N, n, n]: bias[h, clamp(j - i, -R, R) + R] for query i, key j (see the docstring)."""
    reach = (bias.shape[1] - 1) // 2
    i = torch.arange(n, device=bias.device)
    return bias[:, (i[None, :] - i[:, None]).clamp(-reach, reach) + reach]


def _additive(
    keep: torch.Tensor | None,
    bias: torch.Tensor | None,
    n: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """An SDPA float mask [1, N or 1, n or 1, n or 1]: 0 where `keep` (None: everywhere), -inf
    elsewhere, plus the distance bias."""
    if keep is None:
        mask = torch.zeros((1, 1, 1, 1), dtype=dtype, device=device)
    else:
        zero = torch.zeros((), dtype=dtype, device=device)
        mask = torch.where(keep, zero, float("-inf"))[None, None]
    if bias is not None:
        mask = mask + distance_bias(bias, n).to(dtype)[None]
    return mask


def _expand_kv(k: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """Repeat grouped key/value heads so every query head has its own (GQA on the SDPA paths)."""
    if k.shape[1] == num_q_heads:
        return k
    groups = num_q_heads // k.shape[1]
    return k.repeat_interleave(groups, dim=1)


def sdpa_loop(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: RaggedLayout,
    causal: bool,
    window: int | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    out = torch.empty_like(q)
    start = 0
    for n in layout.seqlens:
        end = start + n
        # [1, N, n, D] views of this sequence only. NOTE: 4-D inputs matter: with 3-D ones
        # PyTorch's CPU dispatcher falls back to the unfused math kernel, 4x slower.
        qs, ks, vs = (t[None, start:end].transpose(1, 2) for t in (q, k, v))
        windowed = window is not None and n - 1 > window
        if bias is None and not windowed:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        else:
            keep = band(n, window, q.device) if windowed else None  # type: ignore[arg-type]
            if causal:
                ones = torch.ones(n, n, dtype=torch.bool, device=q.device)
                keep = ones.tril_() if keep is None else keep.tril_()
            mask = keep if bias is None else _additive(keep, bias, n, q.dtype, q.device)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)
        out[start:end] = o[0].transpose(0, 1)
        start = end
    return out


def layout_mask(layout: RaggedLayout, device: torch.device) -> torch.Tensor:
    """[T, T] bool, True where query and key belong to the same sequence (block diagonal)."""
    if layout.mask is not None:
        return layout.mask
    seq_ids = layout.seq_ids  # on the device inside a CUDA graph
    if seq_ids is None:
        seq_ids = torch.repeat_interleave(
            torch.arange(len(layout.seqlens), device=device),
            torch.tensor(layout.seqlens, device=device),
        )
    return seq_ids[:, None] == seq_ids[None, :]


def block_mask(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: RaggedLayout,
    causal: bool,
    window: int | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    mask = layout_mask(layout, q.device)
    if causal:  # NOTE: not in place: the mask may be shared by every layer
        mask = mask & torch.ones_like(mask).tril_()
    if window is not None:
        mask = mask & band(mask.shape[0], window, q.device)
    if bias is not None:  # built once per forward, as the mask
        key = f"block-bias-{causal}-{window}-{q.dtype}"
        if key not in layout.cache:
            layout.cache[key] = _additive(mask, bias, mask.shape[0], q.dtype, q.device)
        mask = layout.cache[key]
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
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: RaggedLayout,
    causal: bool,
    window: int | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    if bias is not None:
        raise ValueError("varlen (FlashAttention) takes no score bias; use cudnn or block_mask")
    if window is not None:
        return _flash_window(q, k, v, layout, causal, window)
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


def padded(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: RaggedLayout,
    causal: bool,
    window: int | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    t, length = q.shape[0], layout.max_seqlen
    key = f"padded-{causal}-{window}-{bias is not None}-{q.dtype}"
    if key not in layout.cache:
        cu = layout.cu_seqlens.long()
        starts, lens = cu[:-1], cu[1:] - cu[:-1]  # [S]
        offsets = torch.arange(length, device=q.device)
        rows = (starts[:, None] + offsets[None, :]).clamp_max(t - 1)  # [S, L] token indices
        keep = (offsets[None, :] < lens[:, None])[:, None, None, :]  # [S, 1, 1, L] real keys
        if window is not None or causal:
            d = offsets[None, :] - offsets[:, None]  # key - query
            near = torch.ones_like(d, dtype=torch.bool)
            if window is not None:
                near &= d.abs() <= window
            if causal:
                near &= d <= 0
            keep = keep & near
        mask = keep  # [S, 1, L or 1, L]
        if bias is not None:  # [S, N, L, L]: -inf off the keys, plus the distance bias
            zero = torch.zeros((), dtype=q.dtype, device=q.device)
            mask = (
                torch.where(keep, zero, float("-inf"))
                + distance_bias(bias, length).to(q.dtype)[None]
            )
        seq_ids = layout.seq_ids
        if seq_ids is None:
            seq_ids = torch.repeat_interleave(
                torch.arange(len(layout.seqlens), device=q.device), lens
            )
        back = (seq_ids, torch.arange(t, device=q.device) - starts[seq_ids])  # token -> (s, l)
        # built once per forward, every layer reuses them
        layout.cache.update(
            {key: rows, key + "-mask": mask, key + "-s": back[0], key + "-l": back[1]}
        )
    rows, mask = layout.cache[key], layout.cache[key + "-mask"]
    back = (layout.cache[key + "-s"], layout.cache[key + "-l"])
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    qp, kp, vp = (x[rows].transpose(1, 2) for x in (q, k, v))  # [S, N, L, D]
    out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)
    return out.transpose(1, 2)[back]  # [T, N, D]


def _flash_window(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: RaggedLayout,
    causal: bool,
    window: int,
) -> torch.Tensor:
    """FlashAttention over the ragged batch with a sliding window, through the ATen op that
    `varlen_attn` wraps (its window arguments exist on every release; varlen_attn's own keyword
    only on newer ones). Flash windows count keys left and right of the query, inclusive."""
    if k.shape[1] != q.shape[1]:
        k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    out = torch.ops.aten._flash_attention_forward(
        q,
        k,
        v,
        layout.cu_seqlens,
        layout.cu_seqlens,
        layout.max_seqlen,
        layout.max_seqlen,
        0.0,
        causal,
        False,
        window_size_left=window,
        window_size_right=0 if causal else window,
    )[0]
    assert isinstance(out, torch.Tensor)
    return out


def cudnn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: RaggedLayout,
    causal: bool,
    window: int | None = None,
    bias: torch.Tensor | None = None,
    *,
    choices: KernelChoices,
) -> torch.Tensor:
    """`choices.cudnn_gqa` (whether cuDNN takes grouped K/V heads) is learned on the first call
    with grouped heads, which is never inside a capture (a bucket's first hit runs eagerly, and
    every capture is preceded by a warm-up run)."""
    mask: torch.Tensor | None = None
    t = q.shape[0]
    windowed = window is not None and t - 1 > window
    # NOTE: one real sequence with causal attention needs no mask either: its padding comes
    # after it, so no real query sees a padding key (padding rows are never read)
    if bias is not None or windowed or not (layout.dense or (layout.solo and causal)):
        key = f"cudnn-bias-{causal}-{q.dtype}-{window if windowed else None}-{bias is not None}"
        mask = layout.cache.get(key)
        if mask is None:
            zero = torch.zeros((), dtype=q.dtype, device=q.device)
            if bias is not None:
                keep: torch.Tensor | None = None if layout.dense else layout_mask(layout, q.device)
                if windowed:
                    w = band(t, window, q.device)  # type: ignore[arg-type]
                    keep = w if keep is None else keep & w
                if causal:
                    c = torch.ones(t, t, dtype=torch.bool, device=q.device).tril_()
                    keep = c if keep is None else keep & c
                mask = _additive(keep, bias, t, q.dtype, q.device)  # [1, N, T, T]
            elif windowed:
                keep = band(t, window, q.device)  # type: ignore[arg-type]
                if not layout.dense:
                    keep = keep & layout_mask(layout, q.device)
                if causal:
                    keep = keep.tril_()
                mask = torch.where(keep, zero, float("-inf"))[None, None]
            elif layout.solo:  # bidirectional: only the padding keys are hidden, [1, 1, 1, T]
                assert layout.seq_ids is not None, "a solo layout carries seq_ids"
                mask = torch.where(layout.seq_ids == 0, zero, float("-inf"))[None, None, None]
            else:
                keep = layout_mask(layout, q.device)
                if causal:
                    keep = keep & torch.ones_like(keep).tril_()
                # an additive bias (0 / -inf), built once per forward: [1, 1, T, T]
                mask = torch.where(keep, zero, float("-inf"))[None, None]
            layout.cache[key] = mask
    on_cuda = q.device.type == "cuda"
    grouped = k.shape[1] != q.shape[1]
    if grouped and not (on_cuda and choices.cudnn_gqa is not False):
        k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    q4, k4, v4 = (t[None].transpose(1, 2) for t in (q, k, v))  # [1, N, T, D] views
    kwargs: dict[str, object] = {"attn_mask": mask, "is_causal": causal and mask is None}
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
                ke, ve = (_expand_kv(t, q.shape[1])[None].transpose(1, 2) for t in (k, v))
                out = F.scaled_dot_product_attention(q4, ke, ve, **kwargs)  # type: ignore[arg-type]
                choices.cudnn_gqa = False
        else:
            out = F.scaled_dot_product_attention(q4, k4, v4, **kwargs)  # type: ignore[arg-type]
    return out[0].transpose(0, 1)


BACKEND_NAMES: tuple[str, ...] = ("varlen", "sdpa_loop", "block_mask", "padded", "cudnn")


def attention_backends(choices: KernelChoices) -> dict[str, AttentionFn]:
    """The registry: every backend by name, the measured one (`cudnn`) bound to `choices`."""
    return {
        "varlen": varlen,
        "sdpa_loop": sdpa_loop,
        "block_mask": block_mask,
        "padded": padded,
        "cudnn": functools.partial(cudnn, choices=choices),
    }


# Backends that read no host value that changes between batches once `seq_ids` is set: the
# only ones a CUDA graph may capture.
CAPTURE_SAFE: tuple[str, ...] = ("varlen", "block_mask", "padded", "cudnn")

# Backends whose work is quadratic in the whole bucket unless the layout is dense
MASKED: tuple[str, ...] = ("block_mask", "cudnn")


def choose_backend(name: str | None, device: torch.device, choices: KernelChoices) -> AttentionFn:
    """The named backend, or the measured default for the device."""
    if name is None or name == "auto":
        name = "varlen" if device.type == "cuda" else "sdpa_loop"
    if name not in BACKEND_NAMES:
        raise ValueError(
            f"unknown attention backend {name!r}; choose from {', '.join(BACKEND_NAMES)}"
        )
    if name == "varlen" and device.type != "cuda":
        raise ValueError("attention backend 'varlen' needs a CUDA device")
    return attention_backends(choices)[name]
