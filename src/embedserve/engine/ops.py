"""The pointwise chains around the matrix products, as one table of functions a model calls.

`EAGER_OPS` is plain PyTorch (the CPU path and the reference); `compiled_ops()` wraps each
function in `torch.compile`, which fuses a chain (residual add + norm, q/k-norm + rotary,
SiLU × gate, gathers + norm, pooling) into one Triton kernel. Both compute the same function;
inside a CUDA graph the compiled kernels replay like any other. A model receives its table at
construction and calls it for every pointwise chain and every matrix product (`linear`), except
where a CPU's packed bf16 product runs the chain after it as oneDNN post-ops (`layers.linear`).

The functions take weights as arguments rather than reading module attributes, so one compiled
function serves every layer (no recompilation per layer). The GEMM kernel each matrix product
takes on CUDA is measured per shape by `kernels.tuning`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, cast

import torch
import torch.nn.functional as F

from embedserve.engine.choices import KernelChoices
from embedserve.engine.kernels.tuning import fused_epilogues, small_m_linear
from embedserve.engine.pooler.pooling import pool
from embedserve.engine.stats import EngineStats


def add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """LayerNorm(x + residual): BERT's post-norm."""
    return F.layer_norm(x + residual, (x.shape[-1],), weight, bias, eps)


def bert_embed(
    input_ids: torch.Tensor,  # [T]
    positions: torch.Tensor,  # [T]
    token_type_ids: torch.Tensor,  # [T]
    word: torch.Tensor,  # [V, H]
    position: torch.Tensor,  # [P, H]
    token_type: torch.Tensor,  # [2, H]
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
) -> torch.Tensor:  # [T, H]
    x = F.embedding(input_ids, word) + F.embedding(positions, position)
    x = x + F.embedding(token_type_ids, token_type)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def add_layer_norm_residual(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(LayerNorm(x + residual), x + residual): a pre-norm encoder's next block input and its
    residual stream (ModernBERT)."""
    total = x + residual
    return F.layer_norm(total, (x.shape[-1],), weight, bias, eps), total


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in fp32, cast back, then scaled (the Hugging Face Qwen3 order of operations)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: scaled by (1 + weight), all in fp32, then cast (Hugging Face's order)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * (1.0 + weight.float())).to(x.dtype)


def gemma_norm_add_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_weight: torch.Tensor,
    pre_weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gemma 3's seam between blocks: the block's output normed and added to the residual
    stream, then the next block's pre-norm: (pre_norm(total), total)."""
    total = residual + gemma_rms_norm(x, post_weight, eps)
    return gemma_rms_norm(total, pre_weight, eps), total


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual): the pre-norm of the next block and its residual."""
    total = x + residual
    return rms_norm(total, weight, eps), total


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] (gate | up) -> [T, I]: SiLU(gate) × up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_mul(gate_up: torch.Tensor, approximate: str) -> torch.Tensor:
    """[T, 2I] (gate | up) -> [T, I]: GELU(gate) × up (GeGLU; `approximate` "none" or "tanh")."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate=approximate) * up


def rope(
    q: torch.Tensor,  # [T, Nq, D]
    k: torch.Tensor,  # [T, Nk, D]
    cos: torch.Tensor,  # [T, 1, D] float32
    sin: torch.Tensor,  # [T, 1, D]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of q and k, computed in float32 and cast back (the order of
    ModernBERT's Hugging Face code; for fp32 inputs any order is the same)."""
    return (
        _rotate(q.float(), cos, sin).to(q.dtype),
        _rotate(k.float(), cos, sin).to(k.dtype),
    )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def qk_norm_rope(
    q: torch.Tensor,  # [T, Nq, D]
    k: torch.Tensor,  # [T, Nk, D]
    q_weight: torch.Tensor,  # [D]
    k_weight: torch.Tensor,  # [D]
    cos: torch.Tensor,  # [T, 1, D] in the model dtype
    sin: torch.Tensor,  # [T, 1, D]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm of q and k, then rotary position embedding (Qwen3)."""
    q = _rotate(rms_norm(q, q_weight, eps), cos, sin)
    k = _rotate(rms_norm(k, k_weight, eps), cos, sin)
    return q, k


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight^T + bias (cuBLAS on CUDA)."""
    return F.linear(x, weight, bias)


def composed(
    linear: Callable[..., torch.Tensor],
    silu_mul: Callable[..., torch.Tensor],
    qk_norm_rope: Callable[..., tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, Callable[..., Any]]:
    """The chains that start with a matrix product, as the product and then the pointwise op
    (two kernels on CUDA): `linear_gelu`, `linear_silu_mul`, `qkv_norm_rope`. Built from a
    table's own product and ops; on CUDA `kernels.tuning.fused_epilogues` replaces each pair
    with one kernel where that measured faster."""

    def linear_gelu(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, approximate: str
    ) -> torch.Tensor:
        """GELU(x W^T + b): the BERT family's up-projection and activation."""
        return F.gelu(linear(x, weight, bias), approximate=approximate)

    def linear_silu_mul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) × up of x W^T, W = [gate; up] ([2I, K]): Qwen3's MLP before `down`."""
        return silu_mul(linear(x, weight, None))

    def qkv_norm_rope(
        x: torch.Tensor,  # [T, H]
        weight: torch.Tensor,  # [(Nq + 2 Nkv) D, H]: query, key, value fused
        bias: torch.Tensor | None,
        nq: int,
        nk: int,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [T, Nq, D], [T, Nkv, D] × 2
        """Qwen3's QKV product, then per-head RMSNorm and rotary of q and k."""
        t, d = x.shape[0], weight.shape[0] // (nq + 2 * nk)
        q, k, v = linear(x, weight, bias).split([nq * d, nk * d, nk * d], -1)
        q, k = qk_norm_rope(q.view(t, nq, d), k.view(t, nk, d), q_weight, k_weight, cos, sin, eps)
        return q, k, v.view(t, nk, d)

    return {
        "linear_gelu": linear_gelu,
        "linear_silu_mul": linear_silu_mul,
        "qkv_norm_rope": qkv_norm_rope,
    }


_EAGER_CHAINS = composed(linear, silu_mul, qk_norm_rope)
# the table's ops built from its product and pointwise ops, not compiled themselves
CHAINS = tuple(_EAGER_CHAINS)


@dataclass(frozen=True)
class Ops:
    """The table; its defaults are the eager functions above."""

    add_layer_norm: Callable[..., torch.Tensor] = add_layer_norm
    add_layer_norm_residual: Callable[..., tuple[torch.Tensor, torch.Tensor]] = (
        add_layer_norm_residual
    )
    bert_embed: Callable[..., torch.Tensor] = bert_embed
    rms_norm: Callable[..., torch.Tensor] = rms_norm
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]] = add_rms_norm
    gemma_rms_norm: Callable[..., torch.Tensor] = gemma_rms_norm
    gemma_norm_add_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]] = gemma_norm_add_norm
    silu_mul: Callable[..., torch.Tensor] = silu_mul
    gelu_mul: Callable[..., torch.Tensor] = gelu_mul
    qk_norm_rope: Callable[..., tuple[torch.Tensor, torch.Tensor]] = qk_norm_rope
    rope: Callable[..., tuple[torch.Tensor, torch.Tensor]] = rope
    pool: Callable[..., torch.Tensor] = pool
    linear: Callable[..., torch.Tensor] = linear
    linear_gelu: Callable[..., torch.Tensor] = _EAGER_CHAINS["linear_gelu"]
    linear_silu_mul: Callable[..., torch.Tensor] = _EAGER_CHAINS["linear_silu_mul"]
    qkv_norm_rope: Callable[..., tuple[torch.Tensor, ...]] = _EAGER_CHAINS["qkv_norm_rope"]


EAGER_OPS = Ops()


class _Timed:
    """Calls a compiled function; the host time of calls that compiled goes to the stats."""

    def __init__(self, fn: Callable[..., Any], stats: EngineStats) -> None:
        self._fn = fn
        self._stats = stats

    def __call__(self, *args: Any) -> Any:
        from torch._dynamo.utils import counters

        before = counters["stats"]["unique_graphs"]
        t0 = time.perf_counter()
        out = self._fn(*args)
        if counters["stats"]["unique_graphs"] != before:
            self._stats.compile_seconds += time.perf_counter() - t0
            self._stats.compiles += 1
        return out


def compiled_ops(
    choices: KernelChoices,
    stats: EngineStats | None = None,
    mode: str | None = None,
    epilogues: bool = True,
) -> Ops:
    """Every op through `torch.compile`, compiled on the first call of each shape family
    (`dynamic=None`: a second token count recompiles once with the token dimension symbolic).
    Compilations and their host seconds are counted in `stats`; GEMM kernels measured per shape
    are kept in `choices`. With `epilogues` a product and the chain after it (`CHAINS`) run as
    one kernel where that measured faster for the shape. Call the table inside
    `compile_limits()`."""
    stats = stats if stats is not None else EngineStats()
    compiled: dict[str, Callable[..., Any]] = {
        f.name: _Timed(torch.compile(getattr(EAGER_OPS, f.name), fullgraph=True, mode=mode), stats)
        for f in fields(Ops)
        if f.name != "linear" and f.name not in CHAINS
    }
    compiled["qk_norm_rope"] = _triton_qk_norm_rope(compiled["qk_norm_rope"])
    compiled["linear"] = small_m_linear(choices, stats)
    pairs = composed(compiled["linear"], compiled["silu_mul"], compiled["qk_norm_rope"])
    compiled.update(fused_epilogues(choices, stats, pairs) if epilogues else pairs)
    return Ops(**compiled)


MAX_COMPILED_VARIANTS = 64


def compile_limits() -> contextlib.AbstractContextManager[None]:
    """A reusable context in which dynamo keeps up to `MAX_COMPILED_VARIANTS` compilations of
    each function: the engine runs its compiled ops inside it.

    NOTE: dynamo caches compilations per code object, so one compiled op serves every bucket,
    model and pooling method of the process; past dynamo's default limit (8 variants) it would
    run eagerly (with `fullgraph=True` on torch 2.13: raise). `config.patch` restores the limits
    on exit and is thread-local on torch 2.13, so nothing else in the process sees them (on
    2.11 they are process-wide while inside). Built once and reused: building a patch costs
    ~80 µs, entering one ~20. NOTE: on torch 2.11 a patch is not re-entrant: never nest it.
    """
    cfg = torch._dynamo.config
    limits = {
        name: max(getattr(cfg, name), MAX_COMPILED_VARIANTS)
        for name in ("recompile_limit", "cache_size_limit")
        if hasattr(cfg, name)
    }
    return cast(contextlib.AbstractContextManager[None], cfg.patch(limits))


def _triton_qk_norm_rope(fallback: Callable[..., Any]) -> Callable[..., Any]:
    """The hand-written kernel where it applies (CUDA, Triton present, power-of-two head dim):
    measured faster than the compiled version (docs/gpu.md)."""
    try:
        from embedserve.engine.kernels import qk_norm_rope as kernel
    except ImportError:  # no Triton: the compiled version
        return fallback

    def qk_norm_rope(
        q: torch.Tensor, k: torch.Tensor, *rest: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if q.is_cuda and kernel.supports(q, rest[2]):
            return kernel.qk_norm_rope(q, k, *rest)
        return fallback(q, k, *rest)

    return qk_norm_rope
