"""The models' linear layer: y = x W^T + b through the ops table the model was built with.

Its parameters are named and shaped as `nn.Linear`'s (`weight` [out, in], `bias` [out]), so the
state-dict keys a checkpoint is loaded into are unchanged. On CUDA `ops.linear` picks, per shape,
between cuBLAS and the small-M Triton kernel (`kernels.tuning.small_m_linear`).

On a CPU in bf16 the engine packs each weight once into oneDNN's blocked layout (`pack`):
`F.linear` reorders the whole [out, in] weight into that layout on every call, which for a short
query (a few rows) costs as much as the product itself. The packed product is the same oneDNN
kernel on the same operands: bitwise equal to `F.linear`'s (tests/engine/test_packed_linear.py).
Unpacked, `activated` (GELU) and `silu_mul` call the ops table's chains (`ops.CHAINS`), which on
CUDA run the product and the chain as one kernel where that measured faster. A packed product
also takes what follows it as oneDNN post-ops (`plus`, `activated`): a residual
sum or an erf GELU applied to its fp32 accumulator before the bf16 result is written, one
operator call and one pass over the rows fewer each (a short query: ~0.07 ms of ~2.1,
benchmarks/results/studies/cpu-fused-cpu2-20261202.json).
"""

from __future__ import annotations

import torch
from torch import nn

from embedserve.engine.cpu import native_bf16
from embedserve.engine.ops import Ops

# the rows oneDNN is told to expect when it picks the packed layout: a short query's few tokens
# (any number of rows runs on it; the hint only picks the blocking)
PACK_ROWS_HINT = 16


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `Linear.pack` applies: a CPU in bf16 with oneDNN's native bf16 (`cpu.native_bf16`:
    elsewhere oneDNN has no bf16 kernel to pack for). A float32 engine packs only where
    `cpu_paths` chose it: its packed kernel sums in another order than the reference-parity
    tests hold `dtype="float32"` to."""
    return device.type == "cpu" and dtype == torch.bfloat16 and can_pack_fp32() and native_bf16()


def can_pack_fp32() -> bool:
    """Whether this PyTorch build has oneDNN's prepacked products (`cpu_paths`' "packed")."""
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


def pack_linears(model: nn.Module) -> int:
    """`pack` every `Linear` of `model`; how many."""
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    for layer in layers:
        layer.pack()
    return len(layers)


class Linear(nn.Module):
    """Its values come from the checkpoint (models are built on the meta device, then loaded)."""

    def __init__(self, in_features: int, out_features: int, ops: Ops, *, bias: bool = True) -> None:
        super().__init__()
        self.ops = ops
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias: nn.Parameter | None = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed: torch.Tensor | None = None  # oneDNN's layout of `weight` (`pack`)
        self.aside: torch.Tensor | None = None  # the packed copy while unused (`use_packed`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return self.ops.linear(x, self.weight, self.bias)

    def plus(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """self(x) + residual; packed, the sum is the product's post-op."""
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise.binary(
                x, residual, self.packed, self.bias, "add"
            )
        return self(x) + residual

    def activated(self, x: torch.Tensor, act: nn.Module) -> torch.Tensor:
        """act(self(x)); packed and `act` the exact (erf) GELU, the GELU is the product's
        post-op, computed on the fp32 sum before its rounding to bf16."""
        if self.packed is not None and isinstance(act, nn.GELU) and act.approximate == "none":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "gelu", [], "none")
        if self.packed is None and isinstance(act, nn.GELU):  # one kernel on CUDA, if faster
            return self.ops.linear_gelu(x, self.weight, self.bias, act.approximate)
        return act(self(x))

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) × up of this gate/up product ([2I, in]: gate rows, then up rows): one
        kernel on CUDA where that measured faster (`ops.linear_silu_mul`)."""
        if self.packed is not None or self.bias is not None:
            return self.ops.silu_mul(self(x))
        return self.ops.linear_silu_mul(x, self.weight)

    def pack(self, *, keep_weight: bool = False) -> None:
        """Hold the weight in oneDNN's blocked layout (CPU). `keep_weight`: keep the plain copy
        too, while the engine measures whether the packed product is the faster (`cpu_paths`);
        else `weight` keeps its shape and dtype for what reads them, without its values' memory
        (`drop_weight`)."""
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_ROWS_HINT)
        if not keep_weight:
            self.drop_weight()

    def use_packed(self, on: bool) -> None:
        """Between `F.linear` on the plain weight (kept by `pack(keep_weight=True)`) and the
        packed copy (set aside meanwhile), while `cpu_paths` times both in turn."""
        if on and self.packed is None:
            self.packed, self.aside = self.aside, None
        elif not on and self.packed is not None:
            self.packed, self.aside = None, self.packed

    def forget_packed(self) -> None:
        self.packed = self.aside = None

    def drop_weight(self) -> None:
        weight = self.weight.detach()
        self.weight = nn.Parameter(
            torch.zeros((), dtype=weight.dtype).expand(weight.shape),
            requires_grad=False,
        )

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"
