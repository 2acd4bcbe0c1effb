"""The CPU's float32 executors, and the start-up choice between them by measurement.

A CPU without native bf16 (AVX2 Zen 2/3, Intel before Sapphire Rapids) runs float32. Three ways
to run the same weights (issue 39):

- **onnx**: the whole encoder in one ONNX Runtime session call (`onnx_encoder`), BERT family;
- **packed**: the eager forward with each weight prepacked once for oneDNN (`layers.linear`);
- **eager**: the eager forward through `F.linear`: the reference every other is checked against.

Which is fastest depends on the CPU (its vector width, its caches, how oneDNN and MLAS block for
it), so the engine measures the available ones at start-up on one short query and a few
passages, holds each to the float32 fidelity guard (cosine >= `MIN_COSINE` to the eager
reference on the guard's probes; one that fails is dropped, the next one stands) and keeps the
fastest (`choose`). An explicit path (`cpu_path=`, `--cpu-path`) is served as asked, still
checked. The choice is printed in the server's ready line and exported in its metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from embedserve.engine.batch import PackedBatch
from embedserve.engine.fidelity import FidelityError, Probe, check_fidelity
from embedserve.engine.layers.linear import Linear, can_pack_fp32
from embedserve.engine.models.base import PackedEncoder

# the order they are tried in: a path that fails the guard hands over to the next one
PATHS = ("onnx", "packed", "eager")
# a float32 path's least cosine to the eager float32 reference (the guard)
MIN_COSINE = 0.99999
# what the choice is timed on: one short query, and a few passages (one batch)
QUERY_TOKENS = 12
PASSAGE_TOKENS = (160, 128, 96, 64)
QUERY_CALLS, PASSAGE_CALLS = 20, 2
SEED = 39

Run = Callable[[nn.Module, PackedBatch], np.ndarray]  # the engine's step on a given model


@dataclass(frozen=True)
class PathTiming:
    path: str
    query_ms: float  # p50 of one short query's step
    passages_ms: float  # the faster of the passage batch's steps
    cosine: float  # least cosine to the eager reference over the guard's probes


@dataclass
class CpuChoice:
    """What the engine chose and why: every path measured, every path dropped with the reason."""

    path: str
    measured: list[PathTiming] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    cosine: float | None = None  # the served path's least cosine to the eager reference
    seconds: float = 0.0  # spent choosing (building, checking and timing the paths)

    def describe(self) -> str:
        """One line: "onnx (query 3.05 ms, 4 passages 61.2 ms; packed 4.10 / 70.3; ...)"."""
        parts = [f"{t.path} {t.query_ms:.2f} / {t.passages_ms:.1f}" for t in self.measured]
        dropped = [f"{p}: {why}" for p, why in self.dropped.items()]
        inner = "; ".join(parts + dropped)
        return (
            f"{self.path} (query / {len(PASSAGE_TOKENS)} passages ms: {inner}; "
            f"chosen in {self.seconds:.1f} s)"
        )


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


def forward_context(model: nn.Module) -> AbstractContextManager[Any]:
    """What a forward through `model` runs inside: `OneTorchThread` for the ONNX executor."""
    from embedserve.engine.onnx_encoder import OnnxEncoder

    return OneTorchThread() if isinstance(model, OnnxEncoder) else nullcontext()


def timing_batches(vocab_size: int, max_positions: int) -> tuple[PackedBatch, PackedBatch]:
    """(one short query, a few passages): fixed ids over the vocabulary, as the guard's probes."""
    rng = np.random.default_rng(SEED)

    def batch(lens: tuple[int, ...]) -> PackedBatch:
        seqs = [rng.integers(0, vocab_size, size=min(n, max_positions)).tolist() for n in lens]
        return PackedBatch.from_token_lists(seqs)

    return batch((QUERY_TOKENS,)), batch(PASSAGE_TOKENS)


def available(model: PackedEncoder) -> list[str]:
    """The paths `model` can take here, in `PATHS` order."""
    from embedserve.engine import onnx_encoder

    can = {"onnx": onnx_encoder.supports(model), "packed": can_pack_fp32(), "eager": True}
    return [p for p in PATHS if can[p]]


def choose(
    model: PackedEncoder,
    folder: str,
    run: Run,
    probes: list[Probe],
    timing: tuple[PackedBatch, PackedBatch],
    asked: str | None = None,
) -> tuple[nn.Module, CpuChoice]:
    """The float32 executor to serve `model` (eager fp32, loaded from `folder`) with, and the
    record of the choice. `asked`: one path, served if it passes the guard (else FidelityError);
    None: every available path checked and timed, the fastest kept (`_fastest`)."""
    start = time.perf_counter()
    paths = [asked] if asked else available(model)
    expected = {id(p.batch): run(model, p.batch) for p in probes}  # the eager reference's rows
    choice = CpuChoice(path="eager")
    built: dict[str, nn.Module] = {}
    for path in sorted(paths, key=lambda p: p != "eager"):  # eager first: packing mutates `model`
        candidate = _build(path, model, folder)
        try:
            cosine = 1.0 if path == "eager" else _guard(candidate, run, expected, probes)
        except FidelityError as err:
            if asked:
                raise
            choice.dropped[path] = str(err).split(":", 1)[-1].strip()
            _discard(path, model)
            continue
        built[path] = candidate
        choice.cosine = cosine if path == asked else choice.cosine
        if not asked:
            choice.measured.append(_time(path, candidate, run, timing, cosine))
    choice.path = asked or _fastest(choice.measured)
    choice.cosine = next(
        (t.cosine for t in choice.measured if t.path == choice.path), choice.cosine
    )
    for path in built:
        if path != choice.path:
            _discard(path, model)
    if choice.path == "packed":
        for layer in _linears(model):
            layer.drop_weight()  # the packed copy alone from now on
    choice.seconds = time.perf_counter() - start
    return built[choice.path], choice


def _guard(
    candidate: nn.Module, run: Run, expected: dict[int, np.ndarray], probes: list[Probe]
) -> float:
    """The candidate's least cosine to the eager reference's rows (`expected`, by probe batch)
    over the guard's probes; FidelityError under `MIN_COSINE`."""

    def fast(batch: PackedBatch) -> np.ndarray:
        return run(candidate, batch)

    def reference(batch: PackedBatch) -> np.ndarray:
        return expected[id(batch)]

    return check_fidelity(fast, reference, probes, min_cosine=MIN_COSINE, runs=1)


def _fastest(measured: list[PathTiming]) -> str:
    """The path whose query and passage times, each over the best of its column, multiply to the
    least: one path for every batch (two would keep two thread pools spinning on the cores)."""
    best_q = min(t.query_ms for t in measured)
    best_p = min(t.passages_ms for t in measured)
    return min(measured, key=lambda t: (t.query_ms / best_q) * (t.passages_ms / best_p)).path


def _build(path: str, model: PackedEncoder, folder: str) -> nn.Module:
    if path == "onnx":
        from pathlib import Path

        from embedserve.engine.onnx_encoder import OnnxEncoder, cache_path

        return OnnxEncoder(model, cache_path(Path(folder)), torch.get_num_threads())
    if path == "packed":
        for layer in _linears(model):
            layer.pack(keep_weight=True)  # unpacked again if another path wins
    elif path != "eager":
        raise ValueError(f"cpu path {path!r} is not one of {', '.join(PATHS)}")
    return model


def _discard(path: str, model: PackedEncoder) -> None:
    if path == "packed":
        for layer in _linears(model):
            layer.unpack()


def _linears(model: nn.Module) -> list[Linear]:
    return [m for m in model.modules() if isinstance(m, Linear)]


def _time(
    path: str, model: nn.Module, run: Run, timing: tuple[PackedBatch, PackedBatch], cosine: float
) -> PathTiming:
    """A short query's p50 and the passage batch's best, each after a warm-up call or three."""
    query, passages = timing

    def seconds(batch: PackedBatch, warm: int, calls: int) -> list[float]:
        for _ in range(warm):
            run(model, batch)
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            run(model, batch)
            times.append(time.perf_counter() - t)
        return times

    query_s = float(np.median(seconds(query, 3, QUERY_CALLS)))
    passages_s = min(seconds(passages, 1, PASSAGE_CALLS))
    return PathTiming(path, query_s * 1e3, passages_s * 1e3, cosine)
