"""How a float32 CPU's chosen executor runs a forward (`cpu_paths` chooses it): one executor for
every batch, or two by batch size (`SizeSplit`), and one torch thread around ONNX Runtime's."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from embedserve.engine.attention import AttentionFn
from embedserve.engine.batch import PackedBatch
from embedserve.loading.spec import PoolingMethod


class OneTorchThread:
    """A forward's torch operators on one thread, while ONNX Runtime runs the encoder on its own:
    what is left to torch (pooling, heads) is a few small operators, and on 2 cores PyTorch's
    second OpenMP thread waits for a core that ONNX Runtime's threads hold (one query's pooling
    `index_add_` 4-6 ms at two threads, 0.1 ms at one, a loaded Zen 3). Reusable."""

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.threads)


class SizeSplit(nn.Module):
    """Two executors of one model by batch size: batches of up to `max_small_tokens` tokens
    through `small` (ONNX Runtime), larger ones through `large` (the torch module, packed or
    eager). Each was held to the guard on its own; both compute the same model."""

    def __init__(self, small: nn.Module, large: nn.Module, max_small_tokens: int) -> None:
        super().__init__()
        self.small, self.large, self.max_small_tokens = small, large, max_small_tokens

    def executor(self, tokens: int) -> nn.Module:
        return self.small if tokens <= self.max_small_tokens else self.large

    def forward(self, input_ids: torch.Tensor, *rest: Any) -> torch.Tensor:
        return cast(torch.Tensor, self.executor(int(input_ids.numel()))(input_ids, *rest))


def forward_context(model: nn.Module | None) -> Callable[[int], AbstractContextManager[Any]]:
    """What a forward of so many tokens through `model` runs inside: `OneTorchThread` where
    ONNX Runtime runs it (a `SizeSplit`'s small batches, or every batch); None: nothing."""
    from embedserve.engine.onnx_encoder import OnnxEncoder

    def around(tokens: int) -> AbstractContextManager[Any]:
        return OneTorchThread() if isinstance(_runs(model, tokens), OnnxEncoder) else nullcontext()

    return around


def host_pooled(
    model: nn.Module,
    batch: PackedBatch,
    method: PoolingMethod,
    attend: AttentionFn,
    after_pooling: nn.Module | None,
) -> np.ndarray | None:
    """A float32 CPU's pooled rows without a torch operator where ONNX Runtime runs the batch
    and nothing follows the pooling (`OnnxEncoder.pooled`); None: the torch path (another
    executor, a dense or score head after the pooling, or a batch the graph leaves)."""
    from embedserve.engine.onnx_encoder import OnnxEncoder

    runs = _runs(model, batch.num_tokens)
    if after_pooling is not None or not isinstance(runs, OnnxEncoder):
        return None
    return runs.pooled(batch, method, attend)


def _runs(model: nn.Module | None, tokens: int) -> nn.Module | None:
    """The executor that runs a forward of so many tokens (a `SizeSplit`'s small or large one)."""
    return model.executor(tokens) if isinstance(model, SizeSplit) else model
