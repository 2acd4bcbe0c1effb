"""The registry: one `Backend` record per attention kernel, what it can run, and the choice of
a model's backends from its family's row (`loading.families.Family.kernels`, `score_bias`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from embedserve.engine.attention import cudnn, flash, sdpa
from embedserve.engine.attention.layout import AttentionFn, RaggedLayout, Scope
from embedserve.engine.choices import KernelChoices
from embedserve.loading.families import Family

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Scope], torch.Tensor]


@dataclass(frozen=True)
class Backend:
    """One attention kernel and what it can run; `bind` makes it the function models call."""

    name: str
    fn: Kernel  # (q, k, v, scope) -> [T, N, D]
    # reads no host value that changes between batches once `seq_ids` is set: a CUDA graph may
    # capture it
    capture_safe: bool
    # materializes a [T, T] mask: work quadratic in the whole bucket unless the layout is dense
    masked: bool
    takes_window: bool = True
    takes_bias: bool = True  # an additive score bias (FlashAttention takes none)
    causal: bool = True  # runs causal attention as well as bidirectional
    cuda_only: bool = False

    def bind(self, choices: KernelChoices) -> AttentionFn:
        """The function the models call, its measured choices (cuDNN's) kept in `choices`."""
        backend = self

        def attend(
            q: torch.Tensor,
            k: torch.Tensor,
            v: torch.Tensor,
            layout: RaggedLayout,
            causal: bool,
            window: int | None = None,
            bias: torch.Tensor | None = None,
        ) -> torch.Tensor:
            backend.check(causal, window, bias)
            return backend.fn(q, k, v, Scope(layout, causal, window, bias, choices))

        return attend

    def check(self, causal: bool, window: int | None, bias: torch.Tensor | None) -> None:
        if bias is not None and not self.takes_bias:
            able = ", ".join(b.name for b in BACKENDS.values() if b.takes_bias)
            raise ValueError(f"{self.name} takes no score bias; use one of {able}")
        if window is not None and not self.takes_window:
            raise ValueError(f"{self.name} takes no sliding window")
        if causal and not self.causal:
            raise ValueError(f"{self.name} runs no causal attention")


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "varlen",
            flash.varlen,
            capture_safe=True,
            masked=False,
            takes_bias=False,
            cuda_only=True,
        ),
        Backend("sdpa_loop", sdpa.sdpa_loop, capture_safe=False, masked=False),
        Backend("block_mask", sdpa.block_mask, capture_safe=True, masked=True),
        Backend("padded", sdpa.padded, capture_safe=True, masked=False),
        Backend("cudnn", cudnn.cudnn, capture_safe=True, masked=True),
    )
}

BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)
CAPTURE_SAFE: tuple[str, ...] = tuple(n for n, b in BACKENDS.items() if b.capture_safe)
MASKED: tuple[str, ...] = tuple(n for n, b in BACKENDS.items() if b.masked)
# the measured defaults per device type: FlashAttention on CUDA, one SDPA per sequence on a CPU
DEVICE_DEFAULTS = {"cuda": "varlen", "cpu": "sdpa_loop"}


def attention_backends(choices: KernelChoices) -> dict[str, AttentionFn]:
    """Every backend by name, bound to `choices`."""
    return {name: b.bind(choices) for name, b in BACKENDS.items()}


def choose_backend(name: str | None, device: torch.device, choices: KernelChoices) -> AttentionFn:
    """The named backend, or the measured default for the device."""
    if name is None or name == "auto":
        name = DEVICE_DEFAULTS.get(device.type, "sdpa_loop")
    if name not in BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; choose from {', '.join(BACKEND_NAMES)}"
        )
    if BACKENDS[name].cuda_only and device.type != "cuda":
        raise ValueError(f"attention backend {name!r} needs a CUDA device")
    return BACKENDS[name].bind(choices)


def model_backend(
    family: Family, name: str | None, device: torch.device, choices: KernelChoices
) -> AttentionFn:
    """A model's eager attention: the named backend (refused if it cannot take the family's
    score bias), else the family's first kernel on CUDA, else the device's default."""
    named = BACKENDS.get(name or "")
    if family.score_bias and named is not None and not named.takes_bias:
        raise ValueError(f"{family.name} models add a score bias {name} cannot take")
    if name in (None, "auto") and family.kernels and device.type == "cuda":
        name = family.kernels[0]
    return choose_backend(name, device, choices)


def graph_candidates(
    family: Family, configured: tuple[str, ...], name: str | None
) -> tuple[str, ...]:
    """A model's graph attention candidates: its family's kernels (the first always, the others
    where configured) unless another backend is named; a named backend alone; else the
    configured ones."""
    kernels = family.kernels
    if kernels and name in (None, "auto", kernels[0]):
        return (kernels[0], *(a for a in kernels[1:] if a in configured))
    if name not in (None, "auto"):
        return (name,)
    return configured
