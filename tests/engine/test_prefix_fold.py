"""Shared prefixes folded (`engine.prefix_fold`, issue 56): the plan (groups, each member's own
last token, positions continuing after the prefix), and the folded forward of a causal Qwen3
embedder and reranker (random weights, fp32, CPU) equal to the unfolded one, a sequence alone
equal to itself in a folded batch; bidirectional models are never folded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.engine import prefix_fold
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.engine.fidelity import row_cosines
from embedserve.scorer import Scorer

TEMPLATE = list(range(1000, 1024))  # 24 tokens every instructed query starts with


def packed(seqs: list[list[int]]) -> PackedBatch:
    return PackedBatch.from_packed(
        np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs]),
        np.array([len(s) for s in seqs]),
    )


def queries(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [
        TEMPLATE + rng.integers(2000, 9000, int(rng.integers(3, 12))).tolist() for _ in range(n)
    ]


def test_the_plan_packs_each_prefix_once_and_keeps_each_members_last_token() -> None:
    seqs = [*queries(10), list(range(3000, 3010)), TEMPLATE[:20]]
    batch = packed(seqs)
    fold = prefix_fold.plan(batch)
    assert fold is not None
    # the 24-token template once (the 20-token member stops it at 19: its last token its own)
    shared = 19
    assert len(fold.input_ids) == batch.num_tokens - 10 * shared
    for i, seq in enumerate(seqs):  # each sequence's last token, at its own position
        assert fold.input_ids[fold.last[i]] == seq[-1]
        assert fold.positions[fold.last[i]] == len(seq) - 1
    prefixes = [s for s in fold.segments if s.prefix is None and s.length == shared]
    assert len(prefixes) == 1
    suffixes = [s for s in fold.segments if s.prefix is not None]
    assert len(suffixes) == 11 and {s.prefix for s in suffixes} == {(prefixes[0].start, shared)}


def test_no_fold_without_a_long_enough_shared_prefix() -> None:
    assert prefix_fold.plan(packed([list(range(i, i + 30)) for i in range(4)])) is None
    assert prefix_fold.plan(packed(queries(1))) is None
    short = [[*TEMPLATE[:10], i] for i in range(5)]  # 10 shared tokens: under MIN_PREFIX
    assert prefix_fold.plan(packed(short)) is None
    assert prefix_fold.plan(packed(queries(3))) is None  # 48 tokens saved: under MIN_SAVED_TOKENS


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    folder = make_checkpoint(
        tmp_path_factory.mktemp("fold") / "q", arch="qwen3-tiny", dtype="float32", seed=3
    )
    return Engine.from_folder(folder, device="cpu", dtype="float32")


def test_a_folded_batch_equals_the_unfolded_one(embedder: Engine) -> None:
    assert embedder.fold_prefixes
    seqs = [*queries(12, seed=1), list(range(3000, 3040))]
    batch = packed(seqs)
    assert prefix_fold.plan(batch) is not None
    folded = embedder.step(batch).wait().copy()
    embedder.fold_prefixes = False
    try:
        plain = embedder.step(batch).wait().copy()
    finally:
        embedder.fold_prefixes = True
    assert row_cosines(folded, plain).min() >= 0.99999
    alone = np.concatenate([embedder.step(packed([s])).wait().copy() for s in seqs[:3]])
    assert row_cosines(alone, folded[:3]).min() >= 0.99999


def test_bidirectional_models_are_never_folded(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path / "bi", arch="qwen3-tiny", attention="bidirectional",
                             dtype="float32", seed=4)  # fmt: skip
    assert not Engine.from_folder(folder, device="cpu", dtype="float32").fold_prefixes


def test_a_rerankers_scores_are_the_same_folded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen3-Reranker's template repeats the system text, the instruction and the query before
    every document: folded, the scores equal the unfolded ones."""
    folder = make_checkpoint(tmp_path / "rr", arch="qwen3-reranker-tiny", dtype="float32", seed=5)
    scorer = Scorer(folder, device="cpu", dtype="float32")
    documents = [f"document {i}: " + "words about the query " * (i + 1) for i in range(6)]
    query = "what are shared prefixes in a reranker's batch?"
    engine = scorer.engine
    assert engine.fold_prefixes
    plans: list[prefix_fold.Fold | None] = []
    plan = prefix_fold.plan
    monkeypatch.setattr(prefix_fold, "plan", lambda b: plans.append(plan(b)) or plans[-1])
    folded = scorer.score(query, documents)
    assert plans and all(p is not None and p.saved > 0.3 for p in plans), plans
    engine.fold_prefixes = False
    plain = scorer.score(query, documents)
    np.testing.assert_allclose(folded, plain, atol=1e-5)


@pytest.mark.gpu
def test_on_the_gpu_a_folded_batch_equals_the_graphs_one(tmp_path: Path) -> None:
    """CUDA, bf16, the fold asked for: the folded batch runs eagerly (a folded packing is no
    graph's bucket); its rows equal the unfolded batch's through the graphs within the guard."""
    folder = make_checkpoint(tmp_path / "q", arch="qwen3-tiny", dtype="float32", seed=3)
    engine = Engine.from_folder(folder, device="cuda")
    assert not engine.fold_prefixes  # off on a GPU until measured
    engine.fold_prefixes = True
    batch = packed([*queries(32, seed=2), list(range(3000, 3100))])
    folded = engine.step(batch).wait().copy()
    engine.fold_prefixes = False
    plain = engine.step(batch).wait().copy()
    assert row_cosines(folded, plain).min() >= 0.999
