"""The encoder's hidden states through the graph runner (`GraphRunner(per_token=True)`, what
`Engine.encode_outputs` replays on CUDA), on the CPU with the stand-in graphs (`graphs.EagerGraph`,
which re-run the captured function into the same output): the real tokens' rows equal the
unpadded eager forward's, every bucket writes into one buffer, the eager → capture → replay
counts, batches above the grid split per token, and the heads' outputs through the runner equal
the eager engine's (a query expansion's cut keys staying eager)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.engine.batch import PackedBatch
from embedserve.engine.choices import KernelChoices
from embedserve.engine.eager import eager_run
from embedserve.engine.engine import Engine
from embedserve.engine.graphs import EagerGraph, GraphConfig, GraphRunner
from embedserve.engine.grid_split import run_parts
from embedserve.engine.pooler.sparse import SparseRows
from embedserve.engine.retrieval import BatchOutputs

CPU = torch.device("cpu")
TEXTS = [
    "what is late interaction retrieval",
    "SPLADE expands a passage into weighted vocabulary terms through its masked-LM head.",
    "ColBERT keeps one vector per token and scores a document by MaxSim.",
]


def _token_runner(engine: Engine, config: GraphConfig | None = None) -> GraphRunner:
    return GraphRunner(
        engine._hidden,
        device=CPU,
        config=config or GraphConfig(attention=("block_mask",)),
        stats=engine.stats,
        choices=KernelChoices(),
        max_positions=engine.max_positions,
        make_graph=EagerGraph,
        per_token=True,
    )


def _random_batch(rng: np.random.Generator, seqlens: list[int], vocab: int) -> PackedBatch:
    return PackedBatch.from_token_lists([rng.integers(0, vocab, n).tolist() for n in seqlens])


def _eager_hidden(engine: Engine, batch: PackedBatch) -> torch.Tensor:
    return eager_run(engine._hidden, batch, CPU, engine.attend)


@torch.inference_mode()
def test_token_rows_lifecycle_one_buffer_and_padding_never_returned(minilm_path: Path) -> None:
    engine = Engine.from_folder(minilm_path, device="cpu", dtype="float32")
    config = GraphConfig(max_tokens=1024, attention=("block_mask",))
    runner = _token_runner(engine, config)
    stats = engine.stats
    rng = np.random.default_rng(0)
    storages = set()
    for seqlens in ([7], [3, 50, 11], [128], [200, 1, 30, 64]):
        before = (stats.eager_runs, stats.captures, stats.replays)
        results = []
        for hit in range(3):
            batch = _random_batch(rng, seqlens, engine.vocab_size)  # fresh ids every hit
            got = runner.run(batch)
            # the real tokens' rows only: the bucket's padding rows are never returned
            assert got is not None and got.shape == (sum(seqlens), engine.hidden_size)
            torch.testing.assert_close(got, _eager_hidden(engine, batch), atol=2e-5, rtol=1e-4)
            storages.add(got.untyped_storage().data_ptr())
            results.append(got.clone())
            counts = (stats.eager_runs, stats.captures, stats.replays)
            expected = [(1, 0, 0), (1, 1, 0), (1, 1, 1)][hit]
            assert tuple(c - b for c, b in zip(counts, before, strict=True)) == expected
        assert not torch.equal(results[1], results[2])  # the replay read the new inputs
    assert runner.num_graphs == 4
    # every bucket wrote into the one buffer of the largest bucket's rows
    assert len(storages) == 1
    assert runner._token_rows is not None
    assert runner._token_rows.shape == (config.max_tokens, engine.hidden_size)


@torch.inference_mode()
def test_a_batch_above_the_grid_is_split_per_token(minilm_path: Path) -> None:
    """Each part's rows land at its tokens' place; no forward above the largest bucket but a
    sequence longer than it, alone (eager); the rows equal the unsplit eager run's."""
    engine = Engine.from_folder(minilm_path, device="cpu", dtype="float32")
    seen: list[int] = []
    hidden = engine._hidden

    def recording(ids, *rest):  # type: ignore[no-untyped-def]
        seen.append(int(ids.shape[0]))
        return hidden(ids, *rest)

    engine._hidden = recording  # type: ignore[method-assign]
    runner = _token_runner(
        engine, GraphConfig(max_tokens=256, max_seqs=8, attention=("block_mask",))
    )
    rng = np.random.default_rng(6)
    seqlens = [*rng.integers(1, 60, 30).tolist(), 400, *([2] * 20)]
    batch = _random_batch(rng, seqlens, engine.vocab_size)
    want = _eager_hidden(engine, batch)
    for _ in range(3):  # eager first hits, then captures, then replays
        seen.clear()
        assert runner.run(batch) is None  # above the grid: the engine splits it
        got = run_parts(batch, runner, engine._hidden, engine.attend)
        assert got.shape == (batch.num_tokens, engine.hidden_size)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
        assert max(n for n in seen if n != 400) <= 256 and seen.count(400) == 1
    assert engine.stats.split_batches == 3 and engine.stats.replays > 0


def _vocab_rows(rows: SparseRows, vocab: int) -> np.ndarray:
    out = np.zeros((len(rows.offsets) - 1, vocab), dtype=np.float32)
    for i in range(len(out)):
        idx, val = rows.row(i)
        out[i, idx] = val
    return out


def _assert_same_outputs(got: BatchOutputs, want: BatchOutputs, vocab: int) -> None:
    """fp32 on both sides: every output within the padded graph's rounding of the eager run."""
    for name in ("dense", "sparse", "multivector"):
        assert (getattr(got, name) is None) == (getattr(want, name) is None), name
    if want.dense is not None:
        np.testing.assert_allclose(got.dense, want.dense, atol=2e-5, rtol=1e-4)
    if want.sparse is not None:
        assert got.sparse is not None
        np.testing.assert_allclose(
            _vocab_rows(got.sparse, vocab), _vocab_rows(want.sparse, vocab), atol=2e-5, rtol=1e-4
        )
    if want.multivector is not None:
        assert got.multivector is not None
        np.testing.assert_array_equal(got.multivector.offsets, want.multivector.offsets)
        np.testing.assert_allclose(
            got.multivector.vectors, want.multivector.vectors, atol=2e-5, rtol=1e-4
        )


@pytest.mark.parametrize("arch", ["bge-m3-tiny", "splade-minilm-l6"])
def test_outputs_through_the_token_runner_equal_eager(retrieval_folder, arch: str) -> None:  # type: ignore[no-untyped-def]
    from embedserve.embedder import Embedder

    eager = Embedder(retrieval_folder(arch), device="cpu", dtype="float32")
    engine = Engine.from_folder(retrieval_folder(arch), device="cpu", dtype="float32")
    assert engine.token_runner is None  # no graphs on the CPU: exactly the eager path
    engine.token_runner = _token_runner(engine)
    outputs = engine.spec.outputs
    batch = PackedBatch.from_token_lists(eager.tokenize(TEXTS))
    want = eager.engine.encode_outputs(batch, outputs)
    stats = engine.stats
    for hit in range(3):
        before = (stats.eager_runs, stats.captures, stats.replays)
        got = engine.encode_outputs(batch, outputs)
        _assert_same_outputs(got, want, engine.vocab_size)
        counts = (stats.eager_runs, stats.captures, stats.replays)
        expected = [(1, 0, 0), (0, 1, 0), (0, 0, 1)][hit]
        assert tuple(c - b for c, b in zip(counts, before, strict=True)) == expected
    # every key visible is the ordinary attention: through the graph
    seqlens = tuple(batch.seqlens.tolist())
    got = engine.encode_outputs(batch, outputs, visible_keys=seqlens)
    _assert_same_outputs(got, want, engine.vocab_size)
    assert stats.replays == 2
    # keys cut short (a ColBERT query's expansion) run eagerly, as without graphs
    cut = tuple(n - 2 for n in seqlens)
    want_cut = eager.engine.encode_outputs(batch, outputs, visible_keys=cut)
    with pytest.raises(AssertionError):  # the cut changes the outputs: a real check below
        _assert_same_outputs(want_cut, want, engine.vocab_size)
    before = (stats.eager_runs, stats.captures, stats.replays)
    got = engine.encode_outputs(batch, outputs, visible_keys=cut)
    _assert_same_outputs(got, want_cut, engine.vocab_size)
    assert (stats.eager_runs, stats.captures, stats.replays) == (before[0] + 1, *before[1:])
