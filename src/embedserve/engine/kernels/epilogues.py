# mypy: disable-error-code="no-untyped-def"
"""GEMMs for few rows (M ≤ 512) with the pointwise chain after them in the epilogue: one kernel
where the model ran two, and the product's output never written to device memory and read back.

- `linear_silu_mul`: [M, K] × gate/up [2I, K] -> SiLU(gate) × up [M, I]. Each program holds a gate
  tile and the up tile of the same columns (rows n and I + n of the fused weight): two
  accumulators, one product each.
- `qkv_norm_rope`: [M, K] × QKV [(Nq + 2 Nkv) D, K] -> q, k, v [M, N, D], q and k RMS-normed per
  head and rotated (Qwen3). A program owns one head's D columns, as two halves (the rotary pairs
  d and d + D/2 are in one program); the per-head norm needs the whole head, so no split-K.
- bias + GELU is `small_gemm`'s kernel with its activation epilogue (`small_gemm.linear(act=)`).

Rounding follows the unfused path: the product is rounded to the model dtype before the chain
(as cuBLAS writes it), and the chain computes as the unfused kernels do (`ops.qk_norm_rope`'s
kernel for q/k, the compiled SiLU × up in fp32). Used only where measured faster than the
unfused pair for the exact shape (`tuning.fused_epilogues`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from embedserve.engine.kernels.small_gemm import Config


@triton.jit
def _glu_kernel(
    x_ptr, w_ptr, y_ptr, M, INTER, K, stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_m[:, None] < M
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    g_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # [BK, BN]
    u_ptrs = g_ptrs + INTER.to(tl.int64) * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K is a multiple of BLOCK_K and INTER of BLOCK_N (checked by the caller): no masks
    for _ in range(0, K // BLOCK_K):
        x = tl.load(x_ptrs, mask=row_ok, other=0.0)
        acc_g = tl.dot(x, tl.load(g_ptrs), acc_g)
        acc_u = tl.dot(x, tl.load(u_ptrs), acc_u)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    dtype = y_ptr.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)
    u = acc_u.to(dtype).to(tl.float32)
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, (g * tl.sigmoid(g) * u).to(dtype), mask=row_ok)


@triton.jit
def _norm_rope_store(
    x1, x2, w_ptr, out_ptrs, c1, s1, c2, s2, eps, mask, HALF: tl.constexpr
):  # fmt: skip
    """One head's halves [BM, HALF] (fp32 of model-dtype values): RMSNorm, rounded, scaled,
    rounded (Hugging Face's order), rotated, stored."""
    var = (tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF)
    r = tl.rsqrt(var + eps)[:, None]
    dtype = out_ptrs.dtype.element_ty
    d = tl.arange(0, HALF)[None, :]
    w1 = tl.load(w_ptr + d).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + d).to(tl.float32)
    n1 = ((x1 * r).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
    n2 = ((x2 * r).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    tl.store(out_ptrs, (n1 * c1 - n2 * s1).to(dtype), mask=mask)
    tl.store(out_ptrs + HALF, (n2 * c2 + n1 * s2).to(dtype), mask=mask)


@triton.jit
def _qkv_rope_kernel(
    x_ptr, w_ptr, b_ptr, q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr,
    M, K, stride_xm, stride_ct, eps,
    NQ: tl.constexpr, NK: tl.constexpr, HALF: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    head = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    d = tl.arange(0, HALF)
    row_ok = offs_m[:, None] < M
    rows = offs_m[:, None].to(tl.int64)
    x_ptrs = x_ptr + rows * stride_xm + offs_k[None, :]
    col = head * (2 * HALF) + d  # this head's first half of columns
    w1_ptrs = w_ptr + col[None, :].to(tl.int64) * K + offs_k[:, None]  # [BK, HALF]
    w2_ptrs = w1_ptrs + HALF * K
    acc1 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    for _ in range(0, K // BLOCK_K):  # K a multiple of BLOCK_K (checked by the caller)
        x = tl.load(x_ptrs, mask=row_ok, other=0.0)
        acc1 = tl.dot(x, tl.load(w1_ptrs), acc1)
        acc2 = tl.dot(x, tl.load(w2_ptrs), acc2)
        x_ptrs += BLOCK_K
        w1_ptrs += BLOCK_K
        w2_ptrs += BLOCK_K
    if HAS_BIAS:
        acc1 += tl.load(b_ptr + col)[None, :].to(tl.float32)
        acc2 += tl.load(b_ptr + HALF + col)[None, :].to(tl.float32)
    dtype = q_ptr.dtype.element_ty
    x1 = acc1.to(dtype).to(tl.float32)  # the product as the unfused GEMM writes it
    x2 = acc2.to(dtype).to(tl.float32)
    if head < NQ + NK:  # q or k: per-head norm and rotary, angles from each row's position
        c_ptrs = rows * stride_ct + d[None, :]
        c1 = tl.load(cos_ptr + c_ptrs, mask=row_ok, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + HALF + c_ptrs, mask=row_ok, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + c_ptrs, mask=row_ok, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + HALF + c_ptrs, mask=row_ok, other=0.0).to(tl.float32)
        if head < NQ:
            out = q_ptr + rows * (NQ * 2 * HALF) + head * (2 * HALF) + d[None, :]
            _norm_rope_store(x1, x2, qw_ptr, out, c1, s1, c2, s2, eps, row_ok, HALF)
        else:
            out = k_ptr + rows * (NK * 2 * HALF) + (head - NQ) * (2 * HALF) + d[None, :]
            _norm_rope_store(x1, x2, kw_ptr, out, c1, s1, c2, s2, eps, row_ok, HALF)
    else:
        out = v_ptr + rows * (NK * 2 * HALF) + (head - NQ - NK) * (2 * HALF) + d[None, :]
        tl.store(out, x1.to(dtype), mask=row_ok)
        tl.store(out + HALF, x2.to(dtype), mask=row_ok)


GLU_CONFIGS = (
    Config(64, 32, 128, 1, 4, 4),
    Config(64, 64, 64, 1, 4, 4),
    Config(64, 16, 256, 1, 4, 3),
    Config(128, 32, 128, 1, 4, 3),
    Config(32, 32, 128, 1, 4, 4),
    Config(16, 64, 128, 1, 4, 4),
    Config(128, 16, 128, 1, 4, 4),  # one row tile at M = 128: 2 × 16 weight rows a program
    Config(128, 32, 64, 1, 4, 4),
)

# block_n is the head dim (one program a head); block_m, block_k, warps and stages vary
QKV_CONFIGS = (
    Config(64, 0, 64, 1, 4, 4),
    Config(64, 0, 128, 1, 4, 3),
    Config(32, 0, 128, 1, 4, 4),
    Config(16, 0, 128, 1, 4, 4),
    Config(128, 0, 64, 1, 8, 3),
)


def _operands_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.dim() == 2
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and x.stride(-1) == 1
        and weight.is_contiguous()
    )


def glu_fits(x: torch.Tensor, weight: torch.Tensor, config: Config) -> bool:
    i, k = weight.shape[0] // 2, weight.shape[1]
    return (
        _operands_ok(x, weight)
        and weight.shape[0] % 2 == 0
        and i % config.block_n == 0
        and k % config.block_k == 0
    )


def linear_silu_mul(
    x: torch.Tensor,  # [M, K], unit stride along K
    weight: torch.Tensor,  # [2I, K] contiguous: gate rows, then up rows
    config: Config,
) -> torch.Tensor:  # [M, I]
    m, k = x.shape
    i = weight.shape[0] // 2
    y = torch.empty((m, i), dtype=x.dtype, device=x.device)
    grid = (i // config.block_n, triton.cdiv(m, config.block_m))
    _glu_kernel[grid](
        x, weight, y, m, i, k, x.stride(0), weight.stride(0), y.stride(0),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return y


def qkv_fits(
    x: torch.Tensor, weight: torch.Tensor, nq: int, nk: int, cos: torch.Tensor, config: Config
) -> bool:
    n, k = weight.shape
    d = n // (nq + 2 * nk)
    return (
        _operands_ok(x, weight)
        and d * (nq + 2 * nk) == n
        and d >= 32
        and d & (d - 1) == 0
        and k % config.block_k == 0
        and cos.stride(-1) == 1
    )


def qkv_norm_rope(
    x: torch.Tensor,  # [M, K], unit stride along K
    weight: torch.Tensor,  # [(Nq + 2 Nkv) D, K] contiguous
    bias: torch.Tensor | None,  # [(Nq + 2 Nkv) D]
    nq: int,
    nk: int,
    q_weight: torch.Tensor,  # [D]
    k_weight: torch.Tensor,  # [D]
    cos: torch.Tensor,  # [M, 1, D] (any row stride)
    sin: torch.Tensor,  # [M, 1, D], cos's strides
    eps: float,
    config: Config,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # contiguous [M, Nq, D], [M, Nkv, D] × 2
    m, k = x.shape
    d = weight.shape[0] // (nq + 2 * nk)
    q = torch.empty((m, nq, d), dtype=x.dtype, device=x.device)
    kk = torch.empty((m, nk, d), dtype=x.dtype, device=x.device)
    v = torch.empty((m, nk, d), dtype=x.dtype, device=x.device)
    if m == 0:
        return q, kk, v
    assert sin.stride() == cos.stride()
    grid = (nq + 2 * nk, triton.cdiv(m, config.block_m))
    _qkv_rope_kernel[grid](
        x, weight, bias if bias is not None else weight, q, kk, v, q_weight, k_weight, cos, sin,
        m, k, x.stride(0), cos.stride(0), eps,
        NQ=nq, NK=nk, HALF=d // 2, HAS_BIAS=bias is not None,
        BLOCK_M=config.block_m, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return q, kk, v
