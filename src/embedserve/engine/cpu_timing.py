"""How the CPU's float32 executors are timed at start-up (`cpu_paths.choose`): the batches (one
short query, 4 and 16 of them, a few passages) and the rounds, within a time budget so that a
large model on a small CPU does not spend a minute choosing; a path that is far behind on every
batch after the first round is timed no more.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
from torch import nn

from embedserve.engine.batch import PackedBatch

Run = Callable[[nn.Module, PackedBatch], np.ndarray]  # the engine's step on a given model

# what the choice is timed on, smallest first: one short query, 4 and 16 of them (what several
# clients' queries make), a few passages (one batch); a split is placed between two of them.
# NOTE: passages of similar length, as `embedder.run_batches` cuts its batches from sequences
# sorted by length; with (160, 128, 96, 64), which ONNX Runtime pads into two calls, a 2-core
# Zen 2 chose oneDNN above 192 tokens (98.8 against 102.9 ms), whose corpus then ran 40 texts/s
# where ONNX Runtime ran 44 (ad-hoc probe)
QUERY_TOKENS = 12
PASSAGE_TOKENS = (128, 120, 104, 96)
TIMING_SHAPES = ((QUERY_TOKENS,), (QUERY_TOKENS,) * 4, (QUERY_TOKENS,) * 16, PASSAGE_TOKENS)
# rounds of the paths in turn; per round each batch once, a batch of queries up to `QUERY_CALLS`
# times, as many as fit `CALL_SECONDS` (its first step, a warm-up, says how long one takes).
# NOTE: past `MIN_ROUNDS`, no round starts after `MEASURE_SECONDS`: a large model on 2 cores
# (XLM-R base, 85 ms a query, 0.8 s the passages) spent 45 s timing 3 rounds of 8 calls a batch
ROUNDS, MIN_ROUNDS, QUERY_CALLS = 3, 2, 8
CALL_SECONDS, MEASURE_SECONDS = 0.1, 10.0
# after the first round a path this many times slower than the fastest on every batch is timed
# no more (its first round's medians stay in the answer), and one path left ends the timing.
# NOTE: Qwen3-0.6B on a 2-core Zen 2, eager against oneDNN prepacked: 2.3x / 1.85x / 1.59x /
# 1.31x in one start (its second round, 12.8 s, only confirmed it), the passages 1.16x and
# 1.28x in two later ones. The closest losers of the smaller models, MiniLM's and XLM-R's eager
# passages, were 1.10x and 1.14x: they stay timed.
DROP_MARGIN = 1.25
# a first step this long is its round's timed step too: what a first step adds (allocations,
# oneDNN's primitives for the shape) is milliseconds, and on Qwen3-0.6B (2 cores) the warm-up
# steps were 12 s of the choice's 37 s
LONG_STEP = 0.5
SEED = 39


# other processes' cores during a timing past which it is contended: not kept as this machine's
# quiet figure (two CPU servers starting at once settled on 512-token batches for 2,048, and a
# path choice measured so was remembered)
CONTENDED_CORES = 0.5


class Neighbours:
    """The cores other processes kept busy while the `with` block ran (`cores`): the machine's
    busy time (/proc/stat) less this process's own CPU time, over the wall time."""

    def __init__(self) -> None:
        self.cores = 0.0

    @staticmethod
    def _busy() -> float:
        """Seconds of busy CPU time of the whole machine (0 where /proc/stat cannot be read)."""
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return 0.0
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> Neighbours:
        self._start = (time.perf_counter(), self._busy(), sum(os.times()[:2]))
        return self

    def __exit__(self, *exc: object) -> None:
        wall, busy, own = self._start
        wall = time.perf_counter() - wall
        others = (self._busy() - busy) - (sum(os.times()[:2]) - own)
        self.cores = max(0.0, others / wall) if wall > 0 and busy else 0.0

    @property
    def contended(self) -> bool:
        return self.cores > CONTENDED_CORES


def timing_batches(vocab_size: int, max_positions: int) -> tuple[PackedBatch, ...]:
    """`TIMING_SHAPES`' batches: fixed ids over the vocabulary, as the guard's probes."""
    rng = np.random.default_rng(SEED)

    def batch(lens: tuple[int, ...]) -> PackedBatch:
        seqs = [rng.integers(0, vocab_size, size=min(n, max_positions)).tolist() for n in lens]
        return PackedBatch.from_token_lists(seqs)

    return tuple(batch(shape) for shape in TIMING_SHAPES)


def measure(
    built: dict[str, nn.Module],
    run: Run,
    timing: tuple[PackedBatch, ...],
    select: Callable[[str], None],
) -> dict[str, tuple[float, ...]]:
    """Each path's median step (ms) on each of the timing batches, the paths timed in turn,
    round after round (a shared machine's speed drifts over seconds: each path samples the same
    ones); per round the passages once, each batch of queries `_calls` times. `select(path)`
    is called before a path's steps (the packed and eager paths are one module)."""
    start = time.perf_counter()
    times: dict[str, list[list[float]]] = {p: [[] for _ in timing] for p in built}
    calls: dict[str, list[int]] = {}
    timed = list(built)
    for round_ in range(ROUNDS):
        if round_ >= MIN_ROUNDS and time.perf_counter() - start > MEASURE_SECONDS:
            break
        if round_ == 1:
            timed = _contenders(_medians(times))
            if len(timed) < 2:
                break
        for path in timed:
            candidate = built[path]
            select(path)
            warm = [0] * len(timing)  # steps of this round the warm-up already timed
            if round_ == 0:  # the first calls warm up, and say how many fit a round
                for i, batch in enumerate(timing):
                    n, first = _calls(run, candidate, batch, i == len(timing) - 1)
                    calls.setdefault(path, []).append(n)
                    if first >= LONG_STEP:
                        times[path][i].append(first)
                        warm[i] = 1
            for i, batch in enumerate(timing):
                for _ in range(calls[path][i] - warm[i]):
                    t = time.perf_counter()
                    run(candidate, batch)
                    times[path][i].append(time.perf_counter() - t)
    return _medians(times)


def _medians(times: dict[str, list[list[float]]]) -> dict[str, tuple[float, ...]]:
    return {p: tuple(float(np.median(t)) * 1e3 for t in per) for p, per in times.items()}


def _contenders(ms: dict[str, tuple[float, ...]]) -> list[str]:
    """The paths still timed: each but those `DROP_MARGIN` times slower than the fastest on
    every batch."""
    best = [min(col) for col in zip(*ms.values(), strict=True)]
    return [
        p for p, row in ms.items()
        if any(t < DROP_MARGIN * b for t, b in zip(row, best, strict=True))
    ]  # fmt: skip


def _calls(run: Run, candidate: nn.Module, batch: PackedBatch, passages: bool) -> tuple[int, float]:
    """Warm `candidate` up on `batch`: how many timed steps of it a round makes (the passages
    1, a batch of queries as many as fit `CALL_SECONDS`, 1 to `QUERY_CALLS`, after as many
    warm-up steps, at most 3), and the first step's seconds."""
    t = time.perf_counter()
    run(candidate, batch)
    first = time.perf_counter() - t
    if passages:
        return 1, first
    n = max(1, min(QUERY_CALLS, int(CALL_SECONDS / max(first, 1e-6))))
    for _ in range(min(n, 3) - 1):
        run(candidate, batch)
    return n, first
