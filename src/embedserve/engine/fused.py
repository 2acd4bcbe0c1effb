"""The pointwise chains around the matrix products, as one table of functions a model calls.

`EAGER_OPS` is plain PyTorch (the CPU path and the reference); `compiled_ops()` wraps each
function in `torch.compile`, which fuses a chain (residual add + norm, q/k-norm + rotary,
SiLU × gate, gathers + norm, pooling) into one Triton kernel. Both compute the same function;
inside a CUDA graph the compiled kernels replay like any other. A model receives its table at
construction and calls it for every pointwise chain and every matrix product (`linear`).

The functions take weights as arguments rather than reading module attributes, so one compiled
function serves every layer (no recompilation per layer).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, cast

import torch
import torch.nn.functional as F

from embedserve.engine.choices import KernelChoices
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


@dataclass(frozen=True)
class Ops:
    add_layer_norm: Callable[..., torch.Tensor]
    add_layer_norm_residual: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    bert_embed: Callable[..., torch.Tensor]
    rms_norm: Callable[..., torch.Tensor]
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    gemma_rms_norm: Callable[..., torch.Tensor]
    gemma_norm_add_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[..., torch.Tensor]
    gelu_mul: Callable[..., torch.Tensor]
    qk_norm_rope: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rope: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    pool: Callable[..., torch.Tensor]
    linear: Callable[..., torch.Tensor] = linear


EAGER_OPS = Ops(
    add_layer_norm=add_layer_norm,
    add_layer_norm_residual=add_layer_norm_residual,
    bert_embed=bert_embed,
    rms_norm=rms_norm,
    add_rms_norm=add_rms_norm,
    gemma_rms_norm=gemma_rms_norm,
    gemma_norm_add_norm=gemma_norm_add_norm,
    silu_mul=silu_mul,
    gelu_mul=gelu_mul,
    qk_norm_rope=qk_norm_rope,
    rope=rope,
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


def compiled_ops(
    choices: KernelChoices, stats: EngineStats | None = None, mode: str | None = None
) -> Ops:
    """Every op through `torch.compile`, compiled on the first call of each shape family
    (`dynamic=None`: a second token count recompiles once with the token dimension symbolic).
    Compilations and their host seconds are counted in `stats`; GEMM kernels measured per shape
    are kept in `choices`. Call the table inside `compile_limits()`."""
    stats = stats if stats is not None else EngineStats()
    compiled: dict[str, Callable[..., Any]] = {
        f.name: _Timed(torch.compile(getattr(EAGER_OPS, f.name), fullgraph=True, mode=mode), stats)
        for f in fields(Ops)
        if f.name != "linear"
    }
    compiled["qk_norm_rope"] = _triton_qk_norm_rope(compiled["qk_norm_rope"])
    compiled["linear"] = small_m_linear(choices, stats)
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


SMALL_M = 512  # GEMMs with at most this many rows are tuned against the Triton kernel
_MISSING = object()


def small_m_linear(
    choices: KernelChoices, stats: EngineStats | None = None
) -> Callable[..., torch.Tensor]:
    """F.linear, except where a GEMM has few rows (M ≤ SMALL_M) and the Triton kernel measured
    faster than cuBLAS for that exact (M, N, K) on this device: then the kernel. Each new shape
    is measured once, outside any capture (a bucket's first hit runs eagerly), and the choice
    kept in `choices.gemm`."""
    stats = stats if stats is not None else EngineStats()
    try:
        from embedserve.engine.kernels import small_gemm as kernel
    except ImportError:  # no Triton
        return linear

    def fast_linear(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if x.dim() != 2 or x.shape[0] > SMALL_M or not kernel.supports(x, weight):
            return F.linear(x, weight, bias)
        m, k = x.shape
        key = (x.device, x.dtype, m, weight.shape[0], k, bias is not None)
        choice = choices.gemm.get(key, _MISSING)
        if choice is _MISSING:
            if torch.cuda.is_current_stream_capturing():  # never measure inside a capture
                return F.linear(x, weight, bias)
            choice = choices.gemm[key] = _tune_gemm(kernel, x, weight, bias, stats)
        if choice is None:
            return F.linear(x, weight, bias)
        return kernel.linear(x, weight, bias, choice)

    return fast_linear


def _graph_us(fn: Callable[[int], Any], calls: int, replays: int = 5) -> float:
    """Device µs per call of `fn(i)`, i = 0..calls-1, captured in one CUDA graph and replayed
    (as inside the model's graph: no host launch cost between calls)."""
    fn(0)  # warm-up (and Triton compile) outside the capture
    torch.cuda.synchronize()
    # NOTE: capture_begin/end rather than `torch.cuda.graph`, which also runs gc.collect() and
    # empty_cache() on entry: costly when every new shape is measured
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            for i in range(calls):
                fn(i)
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls)


def _run_config(
    kernel: Any,
    x: torch.Tensor,
    ws: list[torch.Tensor],
    b: torch.Tensor | None,
    config: Any,
    i: int,
) -> torch.Tensor:
    return kernel.linear(x, ws[i % len(ws)], b, config)


def _tune_gemm(
    kernel: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stats: EngineStats,
) -> Any:
    """Time cuBLAS and every fitting kernel config on fresh random data of this shape, weights
    rotated through more than the L2 cache (as in the model, where every layer's differ)."""
    m, k = x.shape
    n = weight.shape[0]
    gen = torch.Generator(device=x.device).manual_seed(m * 7919 + n * 31 + k)
    copies = max(2, -(-(160 << 20) // (weight.numel() * weight.element_size())))
    copies = min(copies, 16)
    xs = torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)
    ws = [
        torch.randn(weight.shape, generator=gen, device=x.device, dtype=x.dtype) * k**-0.5
        for _ in range(copies)
    ]
    bs = None if bias is None else torch.randn(n, generator=gen, device=x.device, dtype=x.dtype)
    want = F.linear(xs.float(), ws[0].float(), None if bs is None else bs.float())
    timings: dict[str, Any] = {
        "cublas": round(_graph_us(lambda i: F.linear(xs, ws[i % copies], bs), copies), 2)
    }
    best: tuple[float, Any] | None = None
    for config in kernel.CONFIGS:
        if not config.fits(n, k):
            continue
        try:
            got = kernel.linear(xs, ws[0], bs, config).float()
            err = float((got - want).norm() / want.norm())
            if not err < 1e-2:
                raise ValueError(f"relative error {err:.2e}")
            us = _graph_us(functools.partial(_run_config, kernel, xs, ws, bs, config), copies)
        except Exception as e:  # a config that fails to compile or run is skipped, and recorded
            timings[config.name] = f"{type(e).__name__}: {e}"[:200]
            continue
        timings[config.name] = round(us, 2)
        if best is None or us < best[0]:
            best = (us, config)
    # keep cuBLAS unless the kernel is clearly faster (3%: above the noise of 5 replays)
    choice = best[1] if best is not None and best[0] < 0.97 * timings["cublas"] else None
    timings["chosen"] = "cublas" if choice is None else choice.name
    stats.gemm_timings[f"{m}x{n}x{k}" + ("+bias" if bias is not None else "")] = timings
    return choice


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
