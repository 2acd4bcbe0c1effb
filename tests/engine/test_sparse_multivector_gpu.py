"""Sparse and multi-vector outputs on CUDA (bf16) against the same folder on the CPU in fp32, and
the encoder through the CUDA graphs (`Engine.token_runner`) against the eager CUDA path: the
dense vectors and every token vector within bf16's tolerance (cosine >= 0.999), the same token
count per input, the sparse vectors' weights of the CPU's top entries kept (sparse cosine >=
0.99) and their top terms found.

Run on a GPU machine with the folders made where the tokenizers' packages are, then carried
(bf16 weights: 41 and 44 MiB, so one folder per run under a 64 MiB carry), e.g.
    embedserve make-checkpoint --arch bge-m3-tiny --dtype bfloat16 --seed 5 --out f/bge-m3-tiny
    EMBEDSERVE_RETRIEVAL_FOLDERS=f/bge-m3-tiny PYTHONPATH=src \\
        python -m pytest -m gpu tests/engine/test_sparse_multivector_gpu.py"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.embedder import Embedder
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.engine.fidelity import FidelityError
from embedserve.engine.graphs import GraphRunner
from embedserve.engine.retrieval import BatchOutputs

pytestmark = pytest.mark.gpu

TEXTS = [
    "what is late interaction retrieval",
    "SPLADE expands a passage into weighted vocabulary terms through its masked-LM head.",
    "ColBERT keeps one vector per token and scores a document by the sum of each query "
    "token's best match among the document's tokens, which is called MaxSim.",
]


ARCHS = ("splade-minilm-l6", "bge-m3-tiny", "answerai-colbert-small-v1")
# NOTE: the GPU machine has no package of these tokenizers (make-checkpoint's sources): there the
# folders are made here beforehand and carried, named by EMBEDSERVE_RETRIEVAL_FOLDERS ("DIR,DIR";
# each folder's name is its arch); the others are skipped
CARRIED = os.environ.get("EMBEDSERVE_RETRIEVAL_FOLDERS")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if CARRIED:
        return {Path(p).name: Path(p) for p in CARRIED.split(",")}
    root = tmp_path_factory.mktemp("retrieval-gpu")
    try:
        return {a: make_checkpoint(root / a, arch=a, dtype="float32", seed=5) for a in ARCHS}
    except ValueError as e:  # a tokenizer's package missing (the GPU machine): say which
        pytest.skip(
            f"cannot make the folders here ({e}); carry them (EMBEDSERVE_RETRIEVAL_FOLDERS)"
        )


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _sparse_cosine(a: tuple[Any, Any], b: tuple[Any, Any]) -> float:
    """Cosine of two sparse vectors given as (indices, values)."""
    x = dict(zip(list(a[0]), list(a[1]), strict=True))
    y = dict(zip(list(b[0]), list(b[1]), strict=True))
    dot = sum(v * y.get(k, 0.0) for k, v in x.items())
    return dot / (np.linalg.norm(list(x.values())) * np.linalg.norm(list(y.values())))


@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_outputs_equal_cpu_fp32_within_bf16(folders: dict[str, Path], arch: str) -> None:
    if arch not in folders:
        pytest.skip(f"{arch}: not among EMBEDSERVE_RETRIEVAL_FOLDERS")
    cpu = Embedder(folders[arch], device="cpu", dtype="float32").encode_outputs(TEXTS)
    gpu_embedder = Embedder(folders[arch], device="cuda")
    gpu = gpu_embedder.encode_outputs(TEXTS)
    if cpu.dense is not None:
        assert gpu.dense is not None and _cosines(gpu.dense, cpu.dense).min() >= 0.999
    if cpu.sparse is not None:
        assert gpu.sparse is not None
        for want, got in zip(cpu.sparse, gpu.sparse, strict=True):
            pair = (want["indices"], want["values"]), (got["indices"], got["values"])
            assert _sparse_cosine(*pair) >= 0.99
            top = np.argsort(want["values"])[::-1][:5]
            assert {want["indices"][i] for i in top} <= set(got["indices"])
    if cpu.multivector is not None:
        assert gpu.multivector is not None
        for want, got in zip(cpu.multivector, gpu.multivector, strict=True):
            assert want.shape == got.shape
            assert _cosines(got, want).min() >= 0.999
    # one input alone equals the same input inside the batch, on the device too
    alone = gpu_embedder.encode_outputs(TEXTS[2:])
    if gpu.dense is not None:
        assert alone.dense is not None
        assert _cosines(alone.dense, gpu.dense[2:]).min() >= 0.9999
    if gpu.multivector is not None:
        assert alone.multivector is not None
        assert _cosines(alone.multivector[0], gpu.multivector[2]).min() >= 0.9999


def _disagreements(got: BatchOutputs, want: BatchOutputs, what: str) -> list[str]:
    """Each output of `got` outside bf16's tolerance of `want`, as a line of the failure."""
    bad = [
        f"{what}: {name} on one side only"
        for name in ("dense", "sparse", "multivector")
        if (getattr(got, name) is None) != (getattr(want, name) is None)
    ]
    if got.dense is not None and want.dense is not None:
        least = float(_cosines(got.dense, want.dense).min())
        if not least >= 0.999:
            bad.append(f"{what}: dense least cosine {least:.6f} (want >= 0.999)")
    if got.sparse is not None and want.sparse is not None:
        for i in range(len(want.sparse.offsets) - 1):
            (wi, wv), (gi, gv) = want.sparse.row(i), got.sparse.row(i)
            cos = _sparse_cosine((wi, wv), (gi, gv))
            missing = set(wi[np.argsort(-wv)[:5]].tolist()) - set(gi.tolist())
            if not cos >= 0.99 or missing:
                bad.append(
                    f"{what}: sparse input {i}: cosine {cos:.6f} (want >= 0.99), "
                    f"{len(gi)} vs {len(wi)} entries, top-5 ids missing {sorted(missing)}"
                )
    if got.multivector is not None and want.multivector is not None:
        g, w = got.multivector, want.multivector
        if not np.array_equal(g.offsets, w.offsets):
            bad.append(f"{what}: token counts {np.diff(g.offsets)} vs {np.diff(w.offsets)}")
        else:
            least = float(_cosines(g.vectors, w.vectors).min())
            if not least >= 0.999:
                bad.append(f"{what}: token vectors' least cosine {least:.6f} (want >= 0.999)")
    return bad


@pytest.mark.parametrize("arch", ARCHS)
def test_outputs_through_the_graphs_equal_eager_and_cpu_fp32(
    folders: dict[str, Path], arch: str
) -> None:
    """`Engine.encode_outputs` on CUDA runs the encoder through the graphs per bucket: a
    bucket's first call eager, its second captured, its third replayed; every call's outputs
    equal the eager CUDA path's and the CPU's fp32 within bf16's tolerance, for two buckets in
    turn (they share the runner's rows buffer), and the first again after the second."""
    if arch not in folders:
        pytest.skip(f"{arch}: not among EMBEDSERVE_RETRIEVAL_FOLDERS")
    cpu = Embedder(folders[arch], device="cpu", dtype="float32")
    outputs = cpu.spec.outputs
    eager = Engine.from_folder(folders[arch], device="cuda", graphs=False)
    # the guard off: its probes would capture buckets before the counts below start
    graphs = Engine.from_folder(folders[arch], device="cuda", fidelity=False)
    assert eager.token_runner is None, "graphs=False still built a token runner"
    runner = graphs.token_runner
    assert runner is not None, "no token runner on CUDA: encode_outputs would run eagerly"
    stats = graphs.stats
    problems: list[str] = []
    cases = {"3 inputs": TEXTS, "1 input": TEXTS[2:]}
    for label, texts in [*cases.items(), ("3 inputs again", TEXTS)]:
        batch = PackedBatch.from_token_lists(cpu.tokenize(texts))
        want = cpu.engine.encode_outputs(batch, outputs)
        on_cuda = eager.encode_outputs(batch, outputs)
        problems += _disagreements(on_cuda, want, f"{label}: eager CUDA vs CPU fp32")
        # a bucket's three calls; its fourth and later replay too (the "again" case)
        again = label.endswith("again")
        expected = [(0, 0, 1)] * 3 if again else [(1, 0, 0), (0, 1, 0), (0, 0, 1)]
        for call, want_delta in enumerate(expected, 1):
            before = (stats.eager_runs, stats.captures, stats.replays)
            got = graphs.encode_outputs(batch, outputs)
            now = (stats.eager_runs, stats.captures, stats.replays)
            delta = tuple(b - a for a, b in zip(before, now, strict=True))
            assert delta == want_delta, (
                f"{arch}, {label}, call {call}: (eager runs, captures, replays) went up by "
                f"{delta}, expected {want_delta}; capture failures {stats.capture_failures}, "
                f"attention errors {stats.attention_errors}"
            )
            problems += _disagreements(got, want, f"{label}, call {call}: graphs vs CPU fp32")
            problems += _disagreements(got, on_cuda, f"{label}, call {call}: graphs vs eager CUDA")
    assert runner.num_graphs == len(cases), f"{runner.num_graphs} graphs, {stats.as_dict()}"
    assert not problems, f"{arch}:\n" + "\n".join(problems)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_guard_checks_the_outputs_through_the_token_graphs(
    folders: dict[str, Path], arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At start-up the fidelity guard runs the probes through `encode_outputs` (each bucket's
    eager run, capture and replay of the per-token graphs, then the heads) against the eager
    fp32 reference: a faithful engine passes at 0.999 with the token graphs captured, and one
    whose replayed per-token graph gets one token's row wrong is refused (issue 40 item 14)."""
    if arch not in folders:
        pytest.skip(f"{arch}: not among EMBEDSERVE_RETRIEVAL_FOLDERS")
    engine = Engine.from_folder(folders[arch], device="cuda")
    assert engine.fidelity_cosine is not None and engine.fidelity_cosine >= 0.999
    runner = engine.token_runner
    assert runner is not None and runner.num_graphs >= 1, "the guard captured no token graph"
    run = GraphRunner.run

    def replay_wrong(self: GraphRunner, batch: PackedBatch) -> Any:
        replays = self.stats.replays
        rows = run(self, batch)
        if rows is not None and self.per_token and self.stats.replays > replays:
            rows = rows.clone()
            rows[-1] = -rows[-1]
        return rows

    monkeypatch.setattr(GraphRunner, "run", replay_wrong)
    with pytest.raises(FidelityError, match=r"\(run \d of 3\), (sparse|multivector)"):
        Engine.from_folder(folders[arch], device="cuda")
