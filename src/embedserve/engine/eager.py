"""A batch through a model eagerly, unpadded, with its own boundaries: spans, outputs without
graphs, and the fidelity reference (fp32, eager ops, per-sequence SDPA) an engine is held to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from embedserve.engine.attention import AttentionFn, RaggedLayout, choose_backend
from embedserve.engine.batch import PackedBatch
from embedserve.engine.choices import KernelChoices
from embedserve.engine.fidelity import (
    SCORE_MAX_DIFF,
    check_fidelity,
    check_outputs_fidelity,
    make_probes,
)
from embedserve.engine.ops import EAGER_OPS
from embedserve.engine.retrieval import BatchOutputs, RetrievalHeads
from embedserve.loading.spec import PoolingMethod


def eager_run(
    forward: Callable[..., torch.Tensor],
    batch: PackedBatch,
    device: torch.device,
    attend: AttentionFn,
) -> torch.Tensor:
    """One unpadded forward (pooled, or hidden states for spans) with the batch's own
    boundaries (host values allowed)."""

    def to_dev(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(device, non_blocking=True)

    cu_seqlens = to_dev(batch.cu_seqlens)
    layout = RaggedLayout(cu_seqlens, batch.max_seqlen, tuple(batch.seqlens.tolist()))
    ids, positions, types = (
        to_dev(a) for a in (batch.input_ids, batch.positions, batch.token_type_ids)
    )
    return forward(ids, positions, types, to_dev(batch.seq_ids), layout, attend)


@torch.inference_mode()
def reference_run(
    model: nn.Module,
    head: nn.Module | None,
    batch: PackedBatch,
    device: torch.device,
    pooling: PoolingMethod,
) -> np.ndarray:
    """The fidelity reference: fp32, eager ops, per-sequence SDPA, no padding, no graph."""

    def forward(ids, positions, types, seq_ids, layout, attend):  # type: ignore[no-untyped-def]
        hidden = model(ids, positions, types, layout, attend)
        pooled = EAGER_OPS.pool(hidden, layout.cu_seqlens, seq_ids, pooling)
        return pooled if head is None else head(pooled)

    attend = choose_backend("sdpa_loop", device, KernelChoices())
    return eager_run(forward, batch, device, attend).cpu().numpy()


@torch.inference_mode()
def reference_outputs(
    model: nn.Module,
    heads: RetrievalHeads,
    batch: PackedBatch,
    device: torch.device,
) -> BatchOutputs:
    """The fidelity reference of a sparse or multi-vector model's outputs (every one it has, a
    document's): the fp32 eager model's hidden rows (per-sequence SDPA) through the same
    heads."""

    def forward(ids, positions, types, seq_ids, layout, attend):  # type: ignore[no-untyped-def]
        return model(ids, positions, types, layout, attend)

    attend = choose_backend("sdpa_loop", device, KernelChoices())
    hidden = eager_run(forward, batch, device, attend)
    return heads.of_batch(hidden, batch, heads.spec.outputs, False)


def engine_fidelity(engine: Any, reference: nn.Module) -> float:
    """The fidelity guard of `engine` (an `Engine`) against `reference`, its eager fp32 model:
    the least cosine of what it serves (its pooled rows; a sparse or multi-vector model's token
    graphs and heads too). Raises `FidelityError` when they diverge."""
    probes, heads = make_probes(engine.vocab_size, engine.max_positions), engine.retrieval
    spec, device = engine.spec, engine.device
    worst = check_fidelity(
        lambda b: engine.step(b).wait().copy(),
        lambda b: reference_run(reference, engine.after_pooling, b, device, spec.pooling),
        probes,
        # one score per row: compared by difference (a cosine of one number is ±1), after the
        # activation, as the scores are served
        max_diff=SCORE_MAX_DIFF if engine.score_head is not None else None,
        activate=spec.score.activate if spec.score is not None else None,
    )
    if heads is not None:  # what a sparse / multi-vector model serves: token graphs, heads
        worst = min(worst, check_outputs_fidelity(
            lambda b: engine.encode_outputs(b, heads.spec.outputs),
            lambda b: reference_outputs(reference, heads, b, device),
            probes, engine.vocab_size))  # fmt: skip
    return worst
