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
    check_outputs_fidelity,
    make_probes,
    row_cosines,
)
from embedserve.engine.pooler.multivector import TokenVectors
from embedserve.engine.pooler.sparse import SparseRows
from embedserve.engine.retrieval import BatchOutputs


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


def _outputs(dense: np.ndarray, sparse: list[dict[int, float]], vectors: list[np.ndarray]):  # type: ignore[no-untyped-def]
    """A BatchOutputs from plain values: sparse as {id: weight} per input, vectors per input."""
    offsets = np.cumsum([0, *map(len, sparse)])
    indices = np.array([i for row in sparse for i in sorted(row)], np.int64)
    values = np.array([row[i] for row in sparse for i in sorted(row)], np.float32)
    counts = np.cumsum([0, *map(len, vectors)])
    return BatchOutputs(
        dense, SparseRows(offsets, indices, values), TokenVectors(counts, np.concatenate(vectors))
    )


def test_outputs_guard_holds_each_sparse_and_token_vector_to_the_cosine() -> None:
    """Each input's sparse vector and each token vector is compared, not only a pooled one: a
    diverging weight, one token's vector, another token count or a missing output is refused."""
    probes = make_probes(50, 64)
    rng = np.random.default_rng(1)
    dense = rng.standard_normal((2, 4)).astype(np.float32)
    vectors = [rng.standard_normal((n, 3)).astype(np.float32) for n in (2, 3)]
    sparse = [{3: 1.0, 7: 0.5}, {}]  # the second input has no entry, on both sides
    good = _outputs(dense, sparse, vectors)
    assert check_outputs_fidelity(lambda b: good, lambda b: good, probes, 50) == pytest.approx(1.0)
    flipped = [vectors[0], vectors[1] * np.array([[1.0], [1.0], [-1.0]], np.float32)]
    cases = {
        "sparse": _outputs(dense, [{3: 1.0, 9: 0.5}, {}], vectors),  # one id moved
        "multivector": _outputs(dense, sparse, flipped),  # one token's vector
        "multivector token counts": _outputs(dense, sparse, [vectors[0], vectors[1][:2]]),
    }
    for name, bad in cases.items():
        with pytest.raises(FidelityError, match=rf"'short-1x16' \(run 1 of 3\), {name}"):
            check_outputs_fidelity(lambda b, bad=bad: bad, lambda b: good, probes, 50)
    no_sparse = BatchOutputs(dense, None, good.multivector)
    with pytest.raises(FidelityError, match=r"gave \['dense', 'multivector', 'multivector"):
        check_outputs_fidelity(lambda b: no_sparse, lambda b: good, probes, 50)


@pytest.mark.parametrize("arch", ["bge-m3-tiny", "answerai-colbert-small-v1"])
def test_engine_guard_refuses_a_broken_per_token_path(retrieval_folder, monkeypatch, arch) -> None:  # type: ignore[no-untyped-def]
    """The encoder's hidden rows as `encode_outputs` serves them (CUDA: the per-token graphs)
    are checked, not only the pooled `step` (issue 40 item 14): a per-token path that gets one
    token's row wrong is refused at start-up. On the CPU the rows are eager; the stand-in for a
    wrong graph negates the last token's row."""
    folder = retrieval_folder(arch)
    engine = Engine.from_folder(folder, device="cpu", dtype="float32", fidelity=True)
    assert engine.fidelity_cosine is not None and engine.fidelity_cosine > 0.99999
    rows = Engine._hidden_rows

    def last_row_wrong(self, batch, visible_keys):  # type: ignore[no-untyped-def]
        hidden = rows(self, batch, visible_keys).clone()
        hidden[-1] = -hidden[-1]
        return hidden

    monkeypatch.setattr(Engine, "_hidden_rows", last_row_wrong)
    with pytest.raises(
        FidelityError, match=r"'short-1x16' \(run 1 of 3\), (sparse|multivector): cosine"
    ):
        Engine.from_folder(folder, device="cpu", dtype="float32", fidelity=True)


def test_engine_guard_checks_bf16_outputs_on_the_cpu(retrieval_folder) -> None:  # type: ignore[no-untyped-def]
    """bge-m3 in bf16 on the CPU (a reduced-precision path, as on CUDA): its dense, sparse and
    token vectors pass the guard at 0.999 against the fp32 reference."""
    engine = Engine.from_folder(
        retrieval_folder("bge-m3-tiny"), device="cpu", dtype="bfloat16", fidelity=True
    )
    assert engine.dtype == torch.bfloat16
    assert engine.fidelity_cosine is not None and 0.999 <= engine.fidelity_cosine < 1.0
