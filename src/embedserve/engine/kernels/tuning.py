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


def fused_epilogues(
    choices: KernelChoices, stats: EngineStats, unfused: dict[str, Callable[..., Any]]
) -> dict[str, Callable[..., Any]]:
    """`ops.CHAINS` (`linear_gelu`, `linear_silu_mul`, `qkv_norm_rope`) as one kernel each
    (`kernels.epilogues`, `small_gemm`'s GELU epilogue) where, for that exact shape, the kernel
    measured faster than `unfused[name]`: the product and the pointwise kernel after it, as the
    table runs them. Measured once per shape outside any capture, like `small_m_linear`; the
    choice kept in `choices.gemm` (key led by the chain's name), timings in `stats.gemm_timings`
    ("MxNxK+name": "unfused" and each config's µs)."""
    try:
        from embedserve.engine.kernels import epilogues, small_gemm
    except ImportError:  # no Triton
        return dict(unfused)

    def linear_gelu(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, approximate: str
    ) -> torch.Tensor:
        n, k = weight.shape
        ok = small_gemm.supports(x, weight)
        configs = [c for c in small_gemm.CONFIGS if ok and c.split_k == 1 and c.fits(n, k)]
        return _fused_or_not(
            choices, stats, ("gelu-" + approximate, bias is not None), x, weight, configs,
            lambda w: unfused["linear_gelu"](x, w, bias, approximate),
            lambda w, c: small_gemm.linear(x, w, bias, c, act=approximate),
        )  # fmt: skip

    def linear_silu_mul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        configs = [c for c in epilogues.GLU_CONFIGS if epilogues.glu_fits(x, weight, c)]
        return _fused_or_not(
            choices, stats, ("silu",), x, weight, configs,
            lambda w: unfused["linear_silu_mul"](x, w),
            lambda w, c: epilogues.linear_silu_mul(x, w, c),
        )  # fmt: skip

    def qkv_norm_rope(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      nq: int, nk: int, *rest: Any) -> tuple[torch.Tensor, ...]:  # fmt: skip
        qw, kw, cos, sin, eps = rest
        configs = [c for c in epilogues.QKV_CONFIGS if epilogues.qkv_fits(x, weight, nq, nk, cos, c)]  # fmt: skip
        return _fused_or_not(
            choices, stats, ("qkv-norm-rope", nq, nk, bias is not None), x, weight, configs,
            lambda w: unfused["qkv_norm_rope"](x, w, bias, nq, nk, *rest),
            lambda w, c: epilogues.qkv_norm_rope(x, w, bias, nq, nk, qw, kw, cos, sin, eps, c),
        )  # fmt: skip

    return {
        "linear_gelu": linear_gelu,
        "linear_silu_mul": linear_silu_mul,
        "qkv_norm_rope": qkv_norm_rope,
    }


def _fused_or_not(
    choices: KernelChoices,
    stats: EngineStats,
    name: tuple[Any, ...],
    x: torch.Tensor,
    weight: torch.Tensor,
    configs: list[Any],
    unfused: Callable[[torch.Tensor], Any],  # the call on another weight of the same shape
    fused: Callable[[torch.Tensor, Any], Any],  # the same, through the kernel with a config
) -> Any:
    """The call, through the fused kernel config chosen for its shape, or unfused."""
    if not configs or not _tunable(x):
        return unfused(weight)
    key = (*name, x.device, x.dtype, x.shape[0], *weight.shape)
    choice = choices.gemm.get(key, _MISSING)
    if choice is _MISSING:
        if torch.cuda.is_current_stream_capturing():  # never measure inside a capture
            return unfused(weight)
        label = f"{x.shape[0]}x{weight.shape[0]}x{weight.shape[1]}+{name[0]}"
        choice = choices.gemm[key] = _tune_fused(label, weight, configs, unfused, fused, stats)
    return unfused(weight) if choice is None else fused(weight, choice)


def _fused_call(fused: Callable[[torch.Tensor, Any], Any], ws: list[torch.Tensor], config: Any, i: int) -> Any:  # fmt: skip
    return fused(ws[i % len(ws)], config)


def _tunable(x: torch.Tensor) -> bool:
    """A product this module measures: on CUDA, 2-D, few rows."""
    return x.is_cuda and x.dim() == 2 and x.shape[0] <= SMALL_M


def _outputs(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple | list) else [out]


def _tune_fused(
    label: str,
    weight: torch.Tensor,
    configs: list[Any],
    unfused: Callable[[torch.Tensor], Any],
    fused: Callable[[torch.Tensor, Any], Any],
    stats: EngineStats,
) -> Any:
    """Time the unfused pair and every config of the fused kernel on the call's own inputs with
    fresh random weights, rotated through more than the L2 cache; a config must agree with the
    unfused pair (relative error < 1e-2 on every output) and beat it by 3%."""
    k = weight.shape[1]
    gen = torch.Generator(device=weight.device).manual_seed(weight.shape[0] * 31 + k)
    size = weight.numel() * weight.element_size()
    copies = min(16, max(2, -(-(160 << 20) // size)))
    ws = [
        torch.randn(weight.shape, generator=gen, device=weight.device, dtype=weight.dtype) * k**-0.5
        for _ in range(copies)
    ]
    want = [t.float() for t in _outputs(unfused(ws[0]))]
    timings: dict[str, Any] = {
        "unfused": round(_graph_us(lambda i: unfused(ws[i % copies]), copies), 2)
    }
    best: tuple[float, Any] | None = None
    for config in configs:
        try:
            got = _outputs(fused(ws[0], config))
            err = max(
                float((g.float() - w).norm() / w.norm().clamp_min(1e-30))
                for g, w in zip(got, want, strict=True)
            )
            if not err < 1e-2:
                raise ValueError(f"relative error {err:.2e}")
            us = _graph_us(functools.partial(_fused_call, fused, ws, config), copies)
        except Exception as e:  # a config that fails to compile or run is skipped, and recorded
            timings[config.name] = f"{type(e).__name__}: {e}"[:200]
            continue
        timings[config.name] = round(us, 2)
        if best is None or us < best[0]:
            best = (us, config)
    choice = best[1] if best is not None and best[0] < 0.97 * timings["unfused"] else None
    timings["chosen"] = "unfused" if choice is None else choice.name
    stats.gemm_timings[label] = timings
    return choice
