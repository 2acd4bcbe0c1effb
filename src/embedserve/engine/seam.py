"""What a server needs of an engine, in one record the engine builds (`Engine.seam`): the step and
its check, and the values the server reads of it once (its widths and rules, its span pooling and
outputs, its batch budget, what the ready line and the metrics say). Tests build one around a fake.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from embedserve.engine.batch import PackedBatch
from embedserve.loading.retrieval import RetrievalSpec


class ResultHandle(Protocol):
    """A step's result: ready at once (the CPU, span pooling, outputs) or when the device is
    done (a `LazyTensor`)."""

    def ready(self) -> bool: ...
    def wait(self) -> np.ndarray: ...


# Late chunking: run a batch through the model and mean-pool each [start, end) span of its packed
# tokens: [K, H] float32 (`Engine.embed_spans`).
SpanPooler = Callable[[PackedBatch, np.ndarray], np.ndarray]
# A batch's outputs from one forward: `Engine.encode_outputs(batch, outputs, query=...,
# visible_keys=...)` -> its `BatchOutputs` (dense rows before the head, sparse rows, token
# vectors; per sequence, in order).
OutputsEncoder = Callable[..., Any]


@dataclass(frozen=True)
class EngineSeam:
    # launch a batch: pooled rows [S, output_width] (a scoring model: raw scores [S, 1])
    step: Callable[[PackedBatch], ResultHandle]
    # refuse (ValueError) a batch the model cannot run, before it reaches the device
    check: Callable[[PackedBatch], None]
    output_width: int  # columns of a row `step` returns (1: a scoring model)
    batch_tokens: int  # tokens per batch the engine runs best (`Engine.batch_tokens`)
    output_rules: str = "generic"  # int8/binary and the smallest `dimensions` (`ModelSpec`)
    span_pooler: SpanPooler | None = None  # span (late-chunking) requests; None: refused
    # a sparse or multi-vector model's outputs of a batch, the outputs it has, and its layout
    # (the multi-vector bound's); None / () / None for a dense model
    outputs_encoder: OutputsEncoder | None = None
    model_outputs: tuple[str, ...] = ()
    retrieval: RetrievalSpec | None = None
    # what the ready line and the metrics say: the device, the dtype served, a CPU's executor,
    # the model served ("path, device, precision, outputs, attention, pooling"), the counters
    device: str = "cpu"
    dtype_name: str = "float32"
    cpu_path: str | None = None
    serving: str = ""
    stats: Any = None  # `EngineStats`, live

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"


def engine_seam(engine: Any) -> EngineSeam:
    """`engine`'s (an `Engine`, built) record: what `Engine.seam` returns."""
    spec, outputs = engine.spec, engine.retrieval is not None
    checked, choice = engine.fidelity_cosine, engine.cpu_choice
    # the dtype served: a CPU's default bf16 falls back to fp32 if the guard fails (`Engine`)
    precision = engine.dtype_name + (f", fidelity {checked:.5f}" if checked is not None else "")
    if choice is not None:  # a CPU's float32 executor, measured
        precision += f", cpu path {choice.describe()}"
    what = (
        f"scores pairs ({spec.score.kind})"
        if spec.score is not None
        else f"outputs {', '.join(spec.outputs)}"
        if outputs
        else f"{engine.output_width} dims"
    )
    return EngineSeam(
        engine.step,
        engine.check,
        engine.output_width,
        engine.batch_tokens,
        output_rules=spec.output_rules,
        span_pooler=engine.embed_spans,
        outputs_encoder=engine.encode_outputs if outputs else None,
        model_outputs=tuple(spec.outputs) if outputs else (),
        retrieval=spec.retrieval if outputs else None,
        device=str(engine.device),
        dtype_name=engine.dtype_name,
        cpu_path=engine.cpu_path,
        serving=f"{spec.path}, {engine.device}, {precision}, {what}, "
        f"{spec.attention} attention, {spec.pooling} pooling",
        stats=engine.stats,
    )
