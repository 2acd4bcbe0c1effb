"""The start-up fidelity guard (CPU): it passes a faithful fast path and names a diverging probe."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.engine.fidelity import (
    PROBE_SHAPES,
    FidelityError,
    check_fidelity,
    make_probes,
    row_cosines,
)


def test_probes_are_fixed_and_in_range() -> None:
    a, b = make_probes(1000, 100), make_probes(1000, 100)
    assert [p.name for p in a] == list(PROBE_SHAPES)
    for pa, pb in zip(a, b, strict=True):
        assert np.array_equal(pa.batch.input_ids, pb.batch.input_ids)  # deterministic
        assert pa.batch.input_ids.max() < 1000 and pa.batch.max_seqlen <= 100
        assert len(np.unique(pa.batch.input_ids)) > 1  # never constant ids


def test_row_cosines() -> None:
    a = np.array([[1.0, 0.0], [1.0, 1.0], [2.0, 0.0]], dtype=np.float32)
    b = np.array([[1.0, 0.0], [1.0, -1.0], [-3.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(row_cosines(a, b), [1.0, 0.0, -1.0], atol=1e-12)


def _identity_probe_runs() -> tuple[list, np.ndarray]:  # type: ignore[type-arg]
    probes = make_probes(50, 64)
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    return probes, table


def test_guard_passes_and_reports_the_worst_cosine() -> None:
    probes, table = _identity_probe_runs()

    def reference(b: PackedBatch) -> np.ndarray:
        return np.stack(
            [
                table[b.input_ids[s:e]].mean(0)
                for s, e in zip(b.cu_seqlens, b.cu_seqlens[1:], strict=False)
            ]
        )

    calls = []

    def fast(b: PackedBatch) -> np.ndarray:
        calls.append(b)
        return reference(b) * 1.01 + 1e-4  # a small, scale-only difference

    worst = check_fidelity(fast, reference, probes)
    assert 0.999 <= worst <= 1.0
    assert len(calls) == 3 * len(probes)  # eager, capture and replay runs all checked


def test_guard_names_the_probe_and_cosine_when_the_fast_path_diverges() -> None:
    probes, table = _identity_probe_runs()

    def reference(b: PackedBatch) -> np.ndarray:
        return np.stack(
            [
                table[b.input_ids[s:e]].mean(0)
                for s, e in zip(b.cu_seqlens, b.cu_seqlens[1:], strict=False)
            ]
        )

    runs = {"n": 0}

    def fast(b: PackedBatch) -> np.ndarray:
        runs["n"] += 1
        out = reference(b)
        if b.num_seqs == 3 and runs["n"] % 3 == 0:  # only the replay of the mixed probe is off
            out[1] = -out[1]
        return out

    with pytest.raises(
        FidelityError, match=r"probe 'mixed-3x\(5,77,300\)' \(run 3 of 3\): cosine -1\.0"
    ):
        check_fidelity(fast, reference, probes)


def test_guard_rejects_nan() -> None:
    probes, _ = _identity_probe_runs()

    def reference(b: PackedBatch) -> np.ndarray:
        return np.ones((b.num_seqs, 8), dtype=np.float32)

    def fast(b: PackedBatch) -> np.ndarray:
        return np.full((b.num_seqs, 8), np.nan, dtype=np.float32)

    with pytest.raises(FidelityError, match=r"short-1x16.*cosine nan"):
        check_fidelity(fast, reference, probes)


def test_engine_guard_on_cpu_passes_and_refuses_a_broken_model(minilm_path) -> None:  # type: ignore[no-untyped-def]
    # fp32 asked for: the CPU's default on a native-bf16 CPU is bf16 (`engine.cpu`)
    engine = Engine.from_folder(minilm_path, device="cpu", dtype="float32", fidelity=True)
    assert engine.fidelity_cosine is not None and engine.fidelity_cosine > 0.99999
    broken = Engine.from_folder(minilm_path, device="cpu", dtype="float32")
    with torch.no_grad():
        broken.model.layers[2].down.weight.mul_(-3.0)  # a wrong kernel, in effect
    probes = make_probes(engine.vocab_size, engine.max_positions)

    def reference(b: PackedBatch) -> np.ndarray:
        return engine.step(b).wait().copy()

    with pytest.raises(FidelityError, match=r"short-1x16.*below 0\.999; refusing to serve"):
        check_fidelity(lambda b: broken.step(b).wait().copy(), reference, probes)


def test_guard_holds_scores_to_a_difference_not_a_cosine() -> None:
    """One score per row: a cosine would only compare signs; the guard bounds the difference,
    on every run (a bucket's eager run, its capture and a replay)."""
    probes = make_probes(1000, 512)

    def reference(batch):  # type: ignore[no-untyped-def]
        return (np.arange(batch.num_seqs, dtype=np.float32)[:, None] - 0.5) * 1e-3

    def close(batch):  # type: ignore[no-untyped-def]
        return reference(batch) + 1e-3  # signs flip; within 1e-2

    got = check_fidelity(close, reference, probes, max_diff=1e-2)
    assert np.isfinite(got)

    def far(batch):  # type: ignore[no-untyped-def]
        return reference(batch) + 0.5

    with pytest.raises(FidelityError, match=r"scores differ by 0\.5"):
        check_fidelity(far, reference, probes, max_diff=1e-2)
