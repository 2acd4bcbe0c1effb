"""Per-shape GEMM tuning on CUDA: for a matrix product with few rows, the small-M Triton kernel
(`kernels.small_gemm`) where it measured faster than cuBLAS for that exact (M, N, K), timed the
way the model runs it (inside a CUDA graph, weights rotated through more than the L2 cache)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from embedserve.engine.choices import KernelChoices
from embedserve.engine.stats import EngineStats

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
        return F.linear

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
