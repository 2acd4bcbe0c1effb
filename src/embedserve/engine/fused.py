"""The pointwise chains around the matrix products, as one table of functions a model calls.

`EAGER_OPS` is plain PyTorch (the CPU path and the reference); `compiled_ops()` wraps each
function in `torch.compile`, which fuses a chain (residual add + norm, q/k-norm + rotary,
SiLU × gate, gathers + norm, pooling) into one Triton kernel. Both compute the same function;
inside a CUDA graph the compiled kernels replay like any other.

The functions take weights as arguments rather than reading module attributes, so one compiled
function serves every layer (no recompilation per layer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F

from embedserve.engine.pooling import pool
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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in fp32, cast back, then scaled (the Hugging Face Qwen3 order of operations)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


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


@dataclass(frozen=True)
class Ops:
    add_layer_norm: Callable[..., torch.Tensor]
    bert_embed: Callable[..., torch.Tensor]
    rms_norm: Callable[..., torch.Tensor]
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[..., torch.Tensor]
    qk_norm_rope: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    pool: Callable[..., torch.Tensor]


EAGER_OPS = Ops(
    add_layer_norm=add_layer_norm,
    bert_embed=bert_embed,
    rms_norm=rms_norm,
    add_rms_norm=add_rms_norm,
    silu_mul=silu_mul,
    qk_norm_rope=qk_norm_rope,
    pool=pool,
)


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


def compiled_ops(stats: EngineStats | None = None, mode: str | None = None) -> Ops:
    """Every op through `torch.compile`, compiled on the first call of each shape family
    (`dynamic=None`: a second token count recompiles once with the token dimension symbolic).
    Compilations and their host seconds are counted in `stats`."""
    stats = stats if stats is not None else EngineStats()
    # NOTE: one compiled function serves every bucket, model and pooling method of the process;
    # past dynamo's default limit (8 variants per function) it would silently run eagerly.
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 64))
    compiled: dict[str, Callable[..., Any]] = {
        f.name: _Timed(torch.compile(getattr(EAGER_OPS, f.name), fullgraph=True, mode=mode), stats)
        for f in fields(Ops)
    }
    compiled["qk_norm_rope"] = _triton_qk_norm_rope(compiled["qk_norm_rope"])
    return Ops(**compiled)


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
