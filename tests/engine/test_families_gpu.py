"""Every encoder family on the GPU machine: graphs replay what eager computes (fresh inputs on
each hit: eager run, capture, replay), padding never leaks into real rows, a sequence alone
equals it inside a batch, and bf16 graphs agree with the fp32 CPU path.

Folders are made where the test runs (`make_checkpoint --arch <family>-tiny`, transformers
builds the weights); a family whose transformers class the machine lacks is skipped, by name.
Run there: `PYTHONPATH=src python3 -m pytest -q -m gpu tests/engine/test_families_gpu.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from embedserve.engine import graphs as graphs_module
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.engine.fidelity import row_cosines

pytestmark = pytest.mark.gpu

ARCHS = ["xlm-roberta-tiny", "mpnet-tiny", "nomic-bert-tiny", "modernbert-tiny", "gemma3-tiny"]
# lengths past the tiny configs' local windows (8 tokens), bucket edges, several sequences
SHAPES = [[1], [16], [63], [65], [128], [7, 9], [3, 50, 11], [200, 1, 30, 64], [300],
          [100] * 10, [33] * 40]  # fmt: skip


@pytest.fixture(scope="module", params=ARCHS)
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import transformers

    from embedserve.devtools.checkpoints import make_checkpoint
    from embedserve.devtools.family_checkpoints import ENCODER_ARCHS

    cls = ENCODER_ARCHS[request.param].config["architectures"][0]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {cls}")
    out = tmp_path_factory.mktemp(request.param)
    # the machine has no tokenizer packages: the carried MiniLM folder's BERT tokenizer
    tok = os.environ.get("EMBEDSERVE_MINILM")
    return make_checkpoint(
        out,
        arch=request.param,
        dtype="float32",
        seed=21,
        overwrite=True,
        tokenizer_from=Path(tok) if tok else None,
    )


def _batch(rng: np.random.Generator, seqlens: list[int], vocab: int) -> PackedBatch:
    # ids from the low range every tiny tokenizer's vocabulary covers
    return PackedBatch.from_token_lists(
        [rng.integers(5, min(vocab, 30000), n).tolist() for n in seqlens]
    )


def _assert_close(got: np.ndarray, want: np.ndarray, min_cos: float) -> None:
    assert got.shape == want.shape and np.isfinite(got).all()
    cos = row_cosines(got, want)
    assert cos.min() >= min_cos, f"min cosine {cos.min():.6f} (rows {np.argsort(cos)[:3]})"


def test_graphs_replay_eager_and_padding_never_leaks(folder: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    fast = Engine.from_folder(folder, device="cuda")  # fidelity guard on: it must pass
    assert fast.fidelity_cosine is not None and fast.fidelity_cosine >= 0.999
    eager = Engine.from_folder(folder, device="cuda", graphs=False, fuse=False, fidelity=False)
    cpu = Engine.from_folder(folder, device="cpu")
    rng = np.random.default_rng(1)
    for seqlens in SHAPES:
        for _ in range(3):  # eager hit, capture, replay: each on new token ids
            batch = _batch(rng, seqlens, fast.vocab_size)
            got = fast.step(batch).wait()
            _assert_close(got, eager.step(batch).wait(), 0.999)
        _assert_close(got, cpu.step(batch).wait(), 0.999)  # bf16 graphs against fp32 CPU
    assert fast.stats.replays > 0 and fast.stats.captures > 0

    batch = _batch(rng, [37, 5, 90], fast.vocab_size)  # 132 tokens -> a bucket with padding
    for _ in range(3):
        base = fast.step(batch).wait().copy()
    stage = graphs_module.stage_inputs

    def noisy_padding(b: PackedBatch, plan, out: np.ndarray) -> None:  # type: ignore[no-untyped-def]
        stage(b, plan, out)
        t = plan.num_tokens
        out[b.num_tokens : t] = rng.integers(5, 1000, t - b.num_tokens)

    monkeypatch.setattr(graphs_module, "stage_inputs", noisy_padding)
    for _ in range(3):
        _assert_close(fast.step(batch).wait(), base, 0.99999)
    # the same sequence alone (another bucket and graph) equals it inside the batch
    alone = fast.step(PackedBatch.from_packed(batch.input_ids[:37], batch.seqlens[:1])).wait()
    _assert_close(alone, base[:1], 0.9995)


def test_xlm_roberta_reranker_graphs_match_cpu(tmp_path: Path) -> None:
    from embedserve.devtools.checkpoints import make_checkpoint

    tok = os.environ.get("EMBEDSERVE_MINILM")
    folder = make_checkpoint(
        tmp_path / "r",
        arch="xlm-roberta-reranker-tiny",
        dtype="float32",
        seed=22,
        tokenizer_from=Path(tok) if tok else None,
    )
    fast = Engine.from_folder(folder, device="cuda")  # graphs, fused, fidelity guard (scores)
    cpu = Engine.from_folder(folder, device="cpu")
    rng = np.random.default_rng(5)
    for seqlens in ([40, 17, 90], [128], [33] * 12):
        batch = _batch(rng, seqlens, fast.vocab_size)
        for _ in range(3):
            got = fast.step(batch).wait()
        want = cpu.step(batch).wait()
        assert got.shape == (len(seqlens), 1)
        np.testing.assert_allclose(got, want, atol=2e-2 * max(1.0, float(np.abs(want).max())))
