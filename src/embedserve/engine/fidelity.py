"""The start-up fidelity guard: the fast path must agree with an eager fp32 reference.

Fixed probe batches (deterministic token ids, short / medium / mixed lengths) go through the
fast path several times (a bucket's first hit runs eagerly, the second captures its graph, the
third replays it: each is checked) and once through the reference. If any pooled vector's cosine
similarity to the reference is below the threshold, or not finite, the engine refuses to serve.
A sparse or multi-vector model's served outputs (`check_outputs_fidelity`: the per-token graphs
and the heads) are held to the same cosine, per sparse vector and per token vector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from embedserve.engine.batch import PackedBatch

if TYPE_CHECKING:
    from embedserve.engine.retrieval import BatchOutputs

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
OutputsRun = Callable[[PackedBatch], "BatchOutputs"]  # a batch -> its sparse / multi-vector outputs


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
    """Cosine similarity of each row of `a` with the same row of `b` (computed in float64); two
    all-zero rows are equal (1: a sparse vector with no entry on both sides)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    num = (a64 * b64).sum(axis=1)
    na, nb = np.linalg.norm(a64, axis=1), np.linalg.norm(b64, axis=1)
    return np.where((na == 0) & (nb == 0), 1.0, num / np.maximum(na * nb, 1e-300))


def _least_cosine(out: np.ndarray, ref: np.ndarray, what: str, min_cosine: float) -> float:
    """The least row cosine of `out` to `ref`; FidelityError (naming `what`) on another shape,
    below `min_cosine` or not finite."""
    if out.shape != ref.shape:
        raise FidelityError(
            f"fidelity probe {what}: fast path returned shape {out.shape}, reference "
            f"{ref.shape}; refusing to serve"
        )
    cos = row_cosines(out, ref)
    low = float(np.min(cos)) if np.all(np.isfinite(cos)) else float("nan")
    if not low >= min_cosine:  # NaN fails too
        raise FidelityError(
            f"fidelity probe {what}: cosine {low:.6f} against the eager fp32 reference is "
            f"below {min_cosine}; refusing to serve"
        )
    return low


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
            what = f"{probe.name!r} (run {run} of {runs})"
            if max_diff is not None and out.shape == ref.shape:
                got, want = (activate(out), activate(ref)) if activate else (out, ref)
                bound = max_diff * max(1.0, float(np.max(np.abs(want))))
                diff = float(np.max(np.abs(got - want)))
                if not diff <= bound:  # NaN fails too
                    raise FidelityError(
                        f"fidelity probe {what}: scores differ by "
                        f"{diff:.6f} from the eager fp32 reference (allowed {bound:.6f}); "
                        "refusing to serve"
                    )
                scores.append((np.reshape(got, -1), np.reshape(want, -1)))
                continue
            worst = min(worst, _least_cosine(out, ref, what, min_cosine))
    if scores:  # every probe's scores as one vector (a cosine of one score is only its sign)
        got, want = (np.concatenate(x)[None] for x in zip(*scores, strict=True))
        worst = float(row_cosines(got, want)[0])
    return worst


def output_rows(out: BatchOutputs, vocab_size: int) -> dict[str, np.ndarray]:
    """Each output of `out` as rows to compare one by one: dense [S, H]; sparse [S, vocab] (each
    input's weights over the vocabulary); multivector [N, D] (a row per token vector) and, to be
    equal, its token count per input [S, 1]."""
    rows: dict[str, np.ndarray] = {}
    if out.dense is not None:
        rows["dense"] = out.dense
    if out.sparse is not None:
        num_seqs = len(out.sparse.offsets) - 1
        weights = np.zeros((num_seqs, vocab_size), np.float32)
        seq = np.repeat(np.arange(num_seqs), np.diff(out.sparse.offsets))
        weights[seq, out.sparse.indices] = out.sparse.values
        rows["sparse"] = weights
    if out.multivector is not None:
        # the counts first: other counts make the vectors' rows other tokens
        rows["multivector token counts"] = np.diff(out.multivector.offsets)[:, None]
        rows["multivector"] = out.multivector.vectors
    return rows


def check_outputs_fidelity(
    fast: OutputsRun,
    reference: OutputsRun,
    probes: list[Probe],
    vocab_size: int,
    *,
    min_cosine: float = MIN_COSINE,
    runs: int = 3,
) -> float:
    """`check_fidelity` for a sparse or multi-vector model's served outputs: on every probe and
    run, each dense row, each input's sparse vector and each token vector at `min_cosine` or
    above against the reference's, the same outputs and token counts; the least cosine."""
    worst = 1.0
    for probe in probes:
        want = output_rows(reference(probe.batch), vocab_size)
        for run in range(1, runs + 1):
            got = output_rows(fast(probe.batch), vocab_size)
            what = f"{probe.name!r} (run {run} of {runs})"
            if got.keys() != want.keys():
                raise FidelityError(
                    f"fidelity probe {what}: fast path gave {sorted(got)}, reference "
                    f"{sorted(want)}; refusing to serve"
                )
            for name, ref in want.items():
                if name.endswith("counts"):  # equal, or the vectors' shapes differ
                    if not np.array_equal(got[name], ref):
                        raise FidelityError(
                            f"fidelity probe {what}, {name}: {got[name].ravel().tolist()}, "
                            f"reference {ref.ravel().tolist()}; refusing to serve"
                        )
                    continue
                low = _least_cosine(got[name], ref, f"{what}, {name}", min_cosine)
                worst = min(worst, low)
    return worst
