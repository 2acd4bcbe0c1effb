# mypy: disable-error-code="no-untyped-def"
"""y = x @ W^T (+ bias) for few rows (M ≤ 512): the weight-streaming GEMMs of batch-1 latency.

At M = 128 cuBLAS picks tiles that leave the H200 streaming weights at 0.8–2.1 TB/s (5.4–6.4 µs
for 4–12 MB; docs/gpu.md). This kernel tiles N finely (16–64 columns) so that more programs
stream weight rows at once, optionally splits K across programs (fp32 atomics into a zeroed
buffer, then one cast), and adds the bias in the epilogue, then optionally a GELU (`act`: the
BERT family's up-projection, one kernel instead of the product and a GELU after it).

Whether it is used for a shape is decided by measurement, per (M, N, K), against cuBLAS
(`SmallGemm.tune`); it only ever runs where it measured faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, ACT: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok = offs_m[:, None] < M
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K is a multiple of BLOCK_K * SPLIT_K and N of BLOCK_N (checked by the caller): no masks
    for _ in range(0, K // (BLOCK_K * SPLIT_K)):
        x = tl.load(x_ptrs, mask=row_ok, other=0.0)
        w = tl.load(w_ptrs)
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K * SPLIT_K
        w_ptrs += BLOCK_K * SPLIT_K
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n)[None, :].to(tl.float32)
        dtype = y_ptr.dtype.element_ty
        if ACT != 0:  # GELU of the product as the unfused GEMM writes it (rounded)
            acc = _gelu(acc.to(dtype).to(tl.float32), ACT)
        tl.store(y_ptrs, acc.to(dtype), mask=row_ok)
    else:
        if HAS_BIAS:  # noqa: SIM102 - a compile-time branch around a run-time one
            if pid_k == 0:
                acc += tl.load(b_ptr + offs_n)[None, :].to(tl.float32)
        tl.atomic_add(y_ptrs, acc, mask=row_ok, sem="relaxed")


@triton.jit
def _gelu(x, ACT: tl.constexpr):
    """ACT 1: the exact (erf) GELU; 2: its tanh approximation, 0.5 x (1 + tanh u) = x σ(2u)."""
    if ACT == 1:
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x * tl.sigmoid(2.0 * u)


# `act` names -> the kernel's ACT: F.gelu's `approximate` values
ACTS = {None: 0, "none": 1, "tanh": 2}


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int

    @property
    def name(self) -> str:
        return (
            f"m{self.block_m}n{self.block_n}k{self.block_k}s{self.split_k}"
            f"w{self.num_warps}p{self.num_stages}"
        )

    def fits(self, n: int, k: int) -> bool:
        return n % self.block_n == 0 and k % (self.block_k * self.split_k) == 0


CONFIGS = (
    Config(64, 32, 128, 1, 4, 4),
    Config(64, 64, 128, 1, 4, 4),
    Config(64, 16, 256, 1, 4, 3),
    Config(128, 32, 128, 1, 4, 4),
    Config(128, 64, 64, 1, 4, 5),
    Config(64, 64, 128, 2, 4, 4),
    Config(64, 32, 128, 4, 4, 4),
    Config(64, 64, 64, 4, 4, 5),
)


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.is_cuda
        and x.dim() == 2
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and x.stride(-1) == 1
        and weight.is_contiguous()
    )


def linear(
    x: torch.Tensor,  # [M, K], unit stride along K
    weight: torch.Tensor,  # [N, K] contiguous
    bias: torch.Tensor | None,  # [N]
    config: Config,
    act: str | None = None,  # None, or the GELU after the bias: F.gelu's `approximate`
) -> torch.Tensor:  # [M, N] in x's dtype
    m, k = x.shape
    n = weight.shape[0]
    split = config.split_k
    assert act is None or split == 1, "an activation epilogue needs the whole sum (no split-K)"
    if split == 1:
        y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    else:
        y = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    grid = (n // config.block_n, triton.cdiv(m, config.block_m), split)
    _linear_kernel[grid](
        x, weight, bias if bias is not None else weight, y, m, n, k,
        x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, SPLIT_K=split, ACT=ACTS[act],
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return y if split == 1 else y.to(x.dtype)
