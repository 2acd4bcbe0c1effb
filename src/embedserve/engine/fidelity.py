"""The start-up fidelity guard: the fast path must agree with an eager fp32 reference.

Fixed probe batches (deterministic token ids, short / medium / mixed lengths) go through the
fast path several times (a bucket's first hit runs eagerly, the second captures its graph, the
third replays it: each is checked) and once through the reference. If any pooled vector's cosine
similarity to the reference is below the threshold, or not finite, the engine refuses to serve.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from embedserve.engine.batch import PackedBatch

MIN_COSINE = 0.999
# a scoring model's scores (after its activation): the largest difference allowed, times the
# reference's largest magnitude when over 1: the tolerance bf16 scores are held to against
# transformers (the rerankers issue's acceptance)
SCORE_MAX_DIFF = 1e-2
PROBE_SEED = 20261129
# name -> sequence lengths; lengths are capped at the model's positions
PROBE_SHAPES: dict[str, tuple[int, ...]] = {
    "short-1x16": (16,),
    "query-1x128": (128,),
    "mixed-3x(5,77,300)": (5, 77, 300),
}

Run = Callable[[PackedBatch], np.ndarray]  # a batch -> pooled [S, H] float32


class FidelityError(RuntimeError):
    """The fast path diverged from the reference: the engine must not serve."""


@dataclass(frozen=True)
class Probe:
    name: str
    batch: PackedBatch


def make_probes(vocab_size: int, max_positions: int) -> list[Probe]:
    """The fixed probe batches: ids drawn from a fixed seed over the whole vocabulary."""
    rng = np.random.default_rng(PROBE_SEED)
    probes = []
    for name, shape in PROBE_SHAPES.items():
        lens = [min(n, max_positions) for n in shape]
        seqs = [rng.integers(0, vocab_size, size=n).tolist() for n in lens]
        probes.append(Probe(name, PackedBatch.from_token_lists(seqs)))
    return probes


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of `a` with the same row of `b` (computed in float64)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    num = (a64 * b64).sum(axis=1)
    den = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return num / np.maximum(den, 1e-300)


def check_fidelity(
    fast: Run,
    reference: Run,
    probes: list[Probe],
    *,
    min_cosine: float = MIN_COSINE,
    runs: int = 3,
    max_diff: float | None = None,
    activate: Callable[[np.ndarray], np.ndarray] | None = None,
) -> float:
    """The smallest cosine over every probe and run; raises FidelityError below `min_cosine`.

    With `max_diff` (one score per row), each probe's scores, after `activate` (a reranker's
    activation: sigmoid or identity), are held to within `max_diff` times max(1, their largest
    magnitude) of the reference's instead, and what is returned is the cosine of all probes'
    scores taken as one vector."""
    worst = 1.0
    scores: list[tuple[np.ndarray, np.ndarray]] = []
    for probe in probes:
        ref = reference(probe.batch)
        for run in range(1, runs + 1):
            out = fast(probe.batch)
            if out.shape != ref.shape:
                raise FidelityError(
                    f"fidelity probe {probe.name!r} (run {run}): fast path returned shape "
                    f"{out.shape}, reference {ref.shape}; refusing to serve"
                )
            if max_diff is not None:
                got, want = (activate(out), activate(ref)) if activate else (out, ref)
                bound = max_diff * max(1.0, float(np.max(np.abs(want))))
                diff = float(np.max(np.abs(got - want)))
                if not diff <= bound:  # NaN fails too
                    raise FidelityError(
                        f"fidelity probe {probe.name!r} (run {run} of {runs}): scores differ by "
                        f"{diff:.6f} from the eager fp32 reference (allowed {bound:.6f}); "
                        "refusing to serve"
                    )
                scores.append((np.reshape(got, -1), np.reshape(want, -1)))
                continue
            cos = row_cosines(out, ref)
            low = float(np.min(cos)) if np.all(np.isfinite(cos)) else float("nan")
            if not low >= min_cosine:  # NaN fails too
                raise FidelityError(
                    f"fidelity probe {probe.name!r} (run {run} of {runs}): cosine {low:.6f} "
                    f"against the eager fp32 reference is below {min_cosine}; refusing to serve"
                )
            worst = min(worst, low)
    if scores:  # every probe's scores as one vector (a cosine of one score is only its sign)
        got, want = (np.concatenate(x)[None] for x in zip(*scores, strict=True))
        worst = float(row_cosines(got, want)[0])
    return worst
