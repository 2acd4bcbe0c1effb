"""A float32 CPU's executors (`engine.cpu_paths`): each one, pinned by name whatever the CPU, gives
the eager float32 reference's vectors (cosine >= 0.99999, a text alone as inside a batch); the
start-up choice keeps the fastest that passes the guard and drops one that fails it; the ONNX
graph is written once per model folder and read back from the cache."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.embedder import Embedder
from embedserve.engine import cpu, cpu_paths, cpu_timing
from embedserve.engine.batch import PackedBatch
from embedserve.engine.cpu_paths import PathTiming
from embedserve.engine.eager import eager_run
from embedserve.engine.engine import Engine
from embedserve.engine.fidelity import FidelityError, row_cosines
from embedserve.engine.layers.linear import Linear
from embedserve.engine.onnx_encoder import (
    MAX_PADDING,
    SOURCE,
    OnnxEncoder,
    cache_path,
    length_groups,
)
from embedserve.engine.placement import resolve_dtype
from tests.engine.test_contention import Quiet

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

TEXTS = [
    "what is the capital of france",
    "A passage about the history of the Roman empire, its roads, its laws and its long decline "
    "in the west, told over several sentences so that it is far longer than a query. " * 3,
    "ok",
    "the quick brown fox jumps over the lazy dog near the river bank at dawn",
]


@pytest.fixture(autouse=True)
def onnx_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The graphs these tests write go to the session's cache (conftest's `_session_cache`: a
    graph is written once); the choices remembered, to one per test. The default dtype is
    float32, as on a CPU without native bf16, so the choice runs (a CPU with it defaults to bf16
    and chose nothing: three tests failed there)."""
    root = Path(os.environ["XDG_CACHE_HOME"])
    monkeypatch.setattr(cpu_paths, "_choices_file", lambda: tmp_path / "cpu-paths.json")
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)
    # the machine seen as quiet: a choice timed beside other work is not remembered
    # (tests/engine/test_contention.py), which these tests of remembering must not meet
    monkeypatch.setattr(cpu_paths, "Neighbours", Quiet)
    return root


@pytest.fixture(scope="module")
def reference(minilm_path: Path) -> np.ndarray:
    return Embedder(minilm_path, device="cpu", dtype="float32").encode(TEXTS)


@pytest.mark.parametrize("path", ["onnx", "packed", "eager"])
def test_a_pinned_path_gives_the_reference_vectors(
    path: str, minilm_path: Path, reference: np.ndarray
) -> None:
    embedder = Embedder(minilm_path, device="cpu", cpu_path=path)
    assert embedder.engine.cpu_path == path and embedder.engine.dtype == torch.float32
    together = embedder.encode(TEXTS)
    assert row_cosines(together, reference).min() >= cpu_paths.MIN_COSINE
    alone = np.concatenate([embedder.encode([t]) for t in TEXTS])
    np.testing.assert_allclose(alone, together, atol=2e-6)
    if path == "packed":  # the plain weights' memory released, the packed copy served
        linears = [m for m in embedder.engine.model.modules() if isinstance(m, Linear)]
        assert linears and all(
            m.packed is not None and m.weight.stride() == (0, 0) for m in linears
        )
        assert embedder.engine.packed_linears == len(linears)


def test_the_fastest_path_by_query_and_passages() -> None:
    def timing(path: str, query: float, passages: float) -> PathTiming:
        return PathTiming(path, query, passages, 1.0)

    # onnx: 2x faster on a query, 10% slower on passages: 1.0 * 1.1 against 2.0 * 1.0
    measured = [
        timing("eager", 8.0, 110.0),
        timing("onnx", 2.0, 110.0),
        timing("packed", 4.0, 100.0),
    ]
    assert cpu_paths._fastest(measured) == "onnx"
    measured = [timing("onnx", 3.0, 300.0), timing("packed", 3.2, 100.0)]
    assert cpu_paths._fastest(measured) == "packed"


def test_a_path_under_the_guard_is_dropped(monkeypatch, minilm_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The default measures every path; one whose vectors fail the guard is not served (the next
    one is), and the record says why. Asked for by name, the same path is refused."""
    hidden_of = OnnxEncoder._hidden  # what the torch forward and the host pooling both read

    def off_by_a_little(self, *args):  # type: ignore[no-untyped-def]
        hidden = hidden_of(self, *args)
        return hidden + 0.02 * np.random.default_rng(0).standard_normal(hidden.shape, np.float32)

    monkeypatch.setattr(OnnxEncoder, "_hidden", off_by_a_little)
    engine = Engine.from_folder(minilm_path, device="cpu", dtype=None)
    choice = engine.cpu_choice
    assert choice is not None and choice.path in ("packed", "eager")
    assert "below 0.99999" in choice.dropped["onnx"]
    assert {t.path for t in choice.measured} == {"packed", "eager"}
    assert all(t.cosine >= cpu_paths.MIN_COSINE for t in choice.measured)
    assert engine.cpu_path == choice.path and choice.path in choice.describe()
    with pytest.raises(FidelityError):
        Engine.from_folder(minilm_path, device="cpu", cpu_path="onnx")


def test_the_choice_is_remembered_per_machine_and_folder(minilm_path: Path) -> None:
    """A second start serves the path the first one measured fastest, checked, not re-timed."""
    first = Engine.from_folder(minilm_path, device="cpu").cpu_choice
    assert first is not None and first.measured and not first.remembered
    second = Engine.from_folder(minilm_path, device="cpu").cpu_choice
    assert second is not None and second.remembered and not second.measured
    assert second.path == first.path and second.cosine is not None
    assert second.cosine >= cpu_paths.MIN_COSINE and "earlier start" in second.describe()


def test_a_remembered_path_under_the_guard_is_measured_again(
    monkeypatch, minilm_path: Path
) -> None:  # type: ignore[no-untyped-def]
    cpu_paths.remember(cpu_paths.choice_key(str(minilm_path)), "onnx")
    hidden_of = OnnxEncoder._hidden

    def off_by_a_little(self, *args):  # type: ignore[no-untyped-def]
        return hidden_of(self, *args) * np.linspace(0.5, 1.5, 384, dtype=np.float32)

    monkeypatch.setattr(OnnxEncoder, "_hidden", off_by_a_little)
    choice = Engine.from_folder(minilm_path, device="cpu").cpu_choice
    assert choice is not None and not choice.remembered and choice.path != "onnx"
    assert "onnx" in choice.dropped
    key = cpu_paths.choice_key(str(minilm_path))
    assert cpu_paths.remembered(key) == choice.path


def test_cpu_path_is_float32_on_the_cpu_only(minilm_path: Path) -> None:
    with pytest.raises(ValueError, match="float32 CPU executor"):
        Engine.from_folder(minilm_path, device="cpu", dtype="bfloat16", cpu_path="onnx")
    with pytest.raises(ValueError, match="is not one of"):
        Engine.from_folder(minilm_path, device="cpu", cpu_path="fast")
    # an asked-for float32 alone is the eager reference, never measured against the others
    engine = Engine.from_folder(minilm_path, device="cpu", dtype="float32")
    assert engine.cpu_choice is None and engine.cpu_path == "eager"


def test_the_graph_is_written_once_per_folder(minilm_path: Path, onnx_cache: Path) -> None:
    first = Engine.from_folder(minilm_path, device="cpu", cpu_path="onnx")
    graph = first.model.path
    assert graph == cache_path(minilm_path) and str(graph).startswith(str(onnx_cache))
    written = graph.stat().st_mtime_ns
    second = Engine.from_folder(minilm_path, device="cpu", cpu_path="onnx")
    assert second.model.path == graph and graph.stat().st_mtime_ns == written
    batch = PackedBatch.from_token_lists([[101, 2054, 2003, 102]])
    np.testing.assert_array_equal(first.step(batch).wait(), second.step(batch).wait())


def test_an_onnx_step_pools_on_the_host_with_the_torch_paths_bits(
    minilm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine.from_folder(minilm_path, device="cpu", cpu_path="onnx")
    batches = [
        PackedBatch.from_token_lists([[101, 2054, 2003, 1037, 3231, 102]]),
        PackedBatch.from_token_lists(
            [[101, 7592, 102], [101, *range(2000, 2060), 102], [101, 102]]
        ),
    ]
    torch_rows = [eager_run(engine._forward, b, engine.device, engine.attend) for b in batches]

    def no_torch_forward(*args: object) -> None:
        raise AssertionError("the torch forward ran")

    monkeypatch.setattr(OnnxEncoder, "forward", no_torch_forward)
    for batch, expected in zip(batches, torch_rows, strict=True):
        np.testing.assert_array_equal(engine.step(batch).wait(), expected.numpy())


def test_the_cache_key_follows_the_weights(tmp_path: Path, minilm_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    weights = folder / "model.safetensors"
    weights.write_bytes(b"one")
    before = cache_path(folder)
    weights.write_bytes(b"other")
    assert cache_path(folder) != before
    assert cache_path(minilm_path) != before


def test_writing_a_graph_removes_the_stale_ones(tmp_path: Path, minilm_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(minilm_path, folder)
    first = Engine.from_folder(folder, device="cpu", cpu_path="onnx").model.path
    root = first.parent.parent
    kept = Engine.from_folder(minilm_path, device="cpu", cpu_path="onnx").model.path
    unrecorded = root / "unrecorded"  # an older release's graph, or one being written
    unrecorded.mkdir()
    (unrecorded / "model.onnx").write_bytes(b"graph")
    orphan = root / "orphan"  # its folder was deleted
    orphan.mkdir()
    (orphan / SOURCE).write_text(json.dumps({"folder": str(tmp_path / "deleted")}))
    os.utime(folder / "model.safetensors", ns=(0, 0))  # a new checkpoint, as far as the key sees
    second = Engine.from_folder(folder, device="cpu", cpu_path="onnx").model.path
    assert second != first and second.exists()
    assert not first.parent.exists() and not orphan.exists()
    assert unrecorded.exists() and kept.exists()
    assert json.loads((second.parent / SOURCE).read_text()) == {"folder": str(folder.resolve())}


@pytest.mark.parametrize(
    "seqlens", [(12,), (5, 77, 256), (100, 99, 98, 3, 2, 1), tuple(range(1, 200, 7)), (256,) * 40]
)
def test_length_groups_cover_every_sequence_with_bounded_padding(seqlens: tuple[int, ...]) -> None:
    groups = length_groups(seqlens)
    assert sorted(i for g in groups for i in g) == list(range(len(seqlens)))
    for g in groups:
        longest = seqlens[g[0]]
        assert all(seqlens[i] <= longest for i in g)
        assert len(g) == 1 or longest * len(g) <= MAX_PADDING * sum(seqlens[i] for i in g)


def test_a_split_where_onnx_wins_the_small_batches_and_torch_the_large() -> None:
    """ONNX Runtime faster up to 16 queries, packed faster on passages: a split at 16 queries'
    tokens, when it scores better than either path alone; no split when one path wins all."""

    def timing(path: str, *ms: float) -> PathTiming:
        return PathTiming(path, ms[0], ms[-1], 1.0, ms)

    sizes = [sum(shape) for shape in cpu_timing.TIMING_SHAPES]
    measured = [
        timing("onnx", 2.0, 4.0, 10.0, 60.0),
        timing("packed", 3.0, 5.0, 11.0, 30.0),
        timing("eager", 4.0, 7.0, 14.0, 40.0),
    ]
    assert cpu_paths._fastest_plan(measured) == ("onnx+packed", sizes[2])
    measured[0] = timing("onnx", 2.0, 6.0, 12.0, 60.0)  # faster on one query only
    assert cpu_paths._fastest_plan(measured) == ("onnx+packed", sizes[0])
    measured[0] = timing("onnx", 2.0, 4.0, 10.0, 20.0)  # faster everywhere
    assert cpu_paths._fastest_plan(measured) == ("onnx", None)
    measured[0] = timing("onnx", 3.5, 6.0, 12.0, 60.0)  # slower everywhere
    assert cpu_paths._fastest_plan(measured) == ("packed", None)
    assert cpu_paths._fastest_plan(measured[1:]) == ("packed", None)


def test_plan_names() -> None:
    assert cpu_paths.plan("packed") == (["packed"], None)
    assert cpu_paths.plan("onnx+eager@192") == (["onnx", "eager"], 192)
    for bad in (
        "onnx+packed",
        "packed+onnx@12",
        "onnx@12",
        "onnx+onnx@12",
        "fast",
        "onnx+packed@x",
    ):
        with pytest.raises(ValueError):
            cpu_paths.plan(bad)


def test_a_split_serves_each_batch_through_its_executor(
    monkeypatch: pytest.MonkeyPatch, minilm_path: Path, reference: np.ndarray
) -> None:
    """A remembered split (ONNX Runtime up to 48 tokens, packed above) gives the reference
    vectors, a text alone as inside a batch; a short query goes to ONNX Runtime on one torch
    thread, the whole batch to the packed products on every thread."""
    cpu_paths.remember(cpu_paths.choice_key(str(minilm_path)), "onnx+packed@48")
    embedder = Embedder(minilm_path, device="cpu")
    choice = embedder.engine.cpu_choice
    assert choice is not None and choice.remembered and choice.path == "onnx+packed"
    assert choice.split_tokens == 48 and "onnx up to 48 tokens" in choice.describe()
    assert embedder.engine.cpu_path == "onnx+packed" and embedder.engine.packed_linears > 0
    onnx_runs: list[int] = []
    hidden_of = OnnxEncoder._hidden

    def counted(self, *args):  # type: ignore[no-untyped-def]
        onnx_runs.append(len(args[0]))
        return hidden_of(self, *args)

    monkeypatch.setattr(OnnxEncoder, "_hidden", counted)
    together = embedder.encode(TEXTS)
    assert onnx_runs == []  # the batch is over 48 tokens: the packed products
    assert row_cosines(together, reference).min() >= cpu_paths.MIN_COSINE
    alone = np.concatenate([embedder.encode([t]) for t in TEXTS])
    assert len(onnx_runs) == 3 and max(onnx_runs) <= 48  # the passage is over 48
    np.testing.assert_allclose(alone, together, atol=2e-6)


@pytest.mark.parametrize("arch", ["splade-minilm-l6", "bge-m3-tiny"])
def test_a_retrieval_models_path_is_checked_on_its_per_token_rows(
    monkeypatch, retrieval_folder, arch: str
) -> None:  # type: ignore[no-untyped-def]
    """A sparse or multi-vector model serves per-token hidden rows (through its heads), not the
    pooled CLS row the guard compared: an executor that gets the last token's row wrong (the
    CLS row right) is refused."""
    folder = retrieval_folder(arch)
    engine = Engine.from_folder(folder, device="cpu", cpu_path="onnx")  # a right one passes
    assert engine.cpu_choice is not None and engine.cpu_choice.cosine >= cpu_paths.MIN_COSINE
    forward = OnnxEncoder.forward

    def last_row_wrong(self, *args):  # type: ignore[no-untyped-def]
        hidden = forward(self, *args).clone()
        hidden[-1] = -hidden[-1]
        return hidden

    monkeypatch.setattr(OnnxEncoder, "forward", last_row_wrong)
    with pytest.raises(FidelityError, match=r"(sparse|multivector): cosine"):
        Engine.from_folder(folder, device="cpu", cpu_path="onnx")


def test_a_colbert_querys_hidden_expansion_keys_reach_onnx_runtime(
    monkeypatch, retrieval_folder
) -> None:  # type: ignore[no-untyped-def]
    """answerai-colbert's queries hide their expansion tokens from the others' attention
    (`visible_keys`): ONNX Runtime's graph limits each row's keys to them (its `lengths`), so its
    query token vectors are the eager reference's, in one padded call of queries that see
    different numbers of keys as alone. A graph fed every key instead (cosine 0.9988 on these
    random weights) is refused by the guard's query side."""
    folder = retrieval_folder("answerai-colbert-small-v1")
    queries = ["what is late interaction", "ok", "the capital of france and its long history"]
    onnx = Embedder(folder, device="cpu", cpu_path="onnx")
    assert onnx.engine.cpu_choice is not None
    assert onnx.engine.cpu_choice.cosine >= cpu_paths.MIN_COSINE
    eager = Embedder(folder, device="cpu", dtype="float32")
    expected = eager.encode_outputs(queries, outputs="multivector", input_type="query")
    together = onnx.encode_outputs(queries, outputs="multivector", input_type="query")
    assert together.multivector is not None and expected.multivector is not None
    for i, query in enumerate(queries):
        alone = onnx.encode_outputs([query], outputs="multivector", input_type="query")
        assert alone.multivector is not None
        assert row_cosines(together.multivector[i], expected.multivector[i]).min() >= 0.99999
        np.testing.assert_allclose(alone.multivector[0], together.multivector[i], atol=2e-6)

    forward = OnnxEncoder.forward

    def every_key(self, ids, positions, types, layout, attend):  # type: ignore[no-untyped-def]
        return forward(self, ids, positions, types, layout, onnx.engine.attend)

    monkeypatch.setattr(OnnxEncoder, "forward", every_key)
    with pytest.raises(FidelityError, match=r"as a query.*multivector: cosine"):
        Engine.from_folder(folder, device="cpu", cpu_path="onnx")


def _refused_without(monkeypatch, tmp_path: Path, folder: Path, piece: str, stand_in) -> None:  # type: ignore[no-untyped-def]
    """With `onnx_nodes.<piece>` replaced by `stand_in` (a graph missing what it adds), the
    start-up guard refuses ONNX Runtime for `folder` (a fresh cache: the graph is written anew)."""
    from embedserve.engine import onnx_nodes

    monkeypatch.setattr(onnx_nodes, piece, stand_in)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-cache"))
    with pytest.raises(FidelityError, match="cosine"):
        Engine.from_folder(folder, device="cpu", cpu_path="onnx")


def _onnx_matches_eager(folder: Path, texts: list[str]) -> None:
    """ONNX Runtime's vectors are eager fp32's (the guard's bound), and each text's alone is the
    same text's inside the padded batch."""
    expected = Embedder(folder, device="cpu", dtype="float32").encode(texts)
    onnx = Embedder(folder, device="cpu", cpu_path="onnx")
    assert onnx.engine.cpu_path == "onnx"
    together = onnx.encode(texts)
    assert row_cosines(together, expected).min() >= cpu_paths.MIN_COSINE
    alone = np.concatenate([onnx.encode([t]) for t in texts])
    np.testing.assert_allclose(alone, together, atol=2e-6)


def test_mpnets_graph_adds_its_relative_position_bias(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """MPNet's graph adds the relative position bias (by key - query distance, per head) to
    every layer's scores: its vectors are the eager reference's, alone as in a padded batch.
    The folder's bias table is drawn wide (std 2; make-checkpoint's is 0.02, too small for the
    guard to see it missing): without the bias the guard refuses the graph."""
    from safetensors.torch import load_file, save_file

    from embedserve.devtools.checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "mpnet", arch="mpnet-tiny", dtype="float32", seed=5)
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    [name] = [k for k in tensors if k.endswith("relative_attention_bias.weight")]
    tensors[name] = torch.randn(tensors[name].shape, generator=torch.manual_seed(0)) * 2.0
    save_file(tensors, weights, metadata={"format": "pt"})
    texts = [*TEXTS, " ".join(["a longer passage about relative positions"] * 12)]
    _onnx_matches_eager(folder, texts)

    _refused_without(monkeypatch, tmp_path, folder, "distance_bias", lambda *args: "")


def _fill_qk_norms(folder: Path, value: float) -> None:
    """Set every q / k RMSNorm weight of a decoder-style folder to `value`: their scale sets the
    scores' size there (the norms undo any scaling of the q / k products)."""
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    for name, t in tensors.items():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            t.fill_(value)
    save_file(tensors, weights, metadata={"format": "pt"})


def _sharpen_attention(folder: Path) -> None:
    """Scale the q and k rows of every fused `attn.Wqkv` by 40: on make-checkpoint's small
    weights every score is near 0 and attention near uniform, whatever the positions."""
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    for name, t in tensors.items():
        if name.endswith("attn.Wqkv.weight"):
            t[: 2 * t.shape[1]] *= 40.0
    save_file(tensors, weights, metadata={"format": "pt"})


def test_nomic_berts_graph_rotates_queries_and_keys(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """NomicBERT's graph (rotary on q and k, SwiGLU, no biases) gives the eager reference's
    vectors, alone as in a padded batch. The folder's q and k weights are scaled up (x40) so
    that attention depends on positions (on make-checkpoint's small weights a graph without the
    rotation passed the guard at 0.9999999966): without the rotation the guard refuses it."""
    from embedserve.devtools.checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "nomic", arch="nomic-bert-tiny", dtype="float32", seed=5)
    _sharpen_attention(folder)
    texts = [*TEXTS, " ".join(["a longer passage about rotary positions"] * 12)]
    _onnx_matches_eager(folder, texts)

    def unrotated(w, rotary, positions, name):  # type: ignore[no-untyped-def]
        shape = (positions, rotary.head_dim // 2)
        return w(name + "_cos", torch.ones(shape)), w(name + "_sin", torch.zeros(shape))

    _refused_without(monkeypatch, tmp_path, folder, "rotary_caches", unrotated)


def test_modernberts_graph_keeps_local_layers_in_their_window(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """ModernBERT's graph (pre-norm, rotary with a base per layer kind, GeGLU, every third layer
    global and the others within |query - key| <= 8 here) gives the eager reference's vectors,
    alone as in a padded batch, for texts longer than the window. With q and k scaled up (x40)
    so that scores depend on positions, a graph whose local layers see every key is refused."""
    from embedserve.devtools.checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "modern", arch="modernbert-tiny", dtype="float32", seed=5)
    _sharpen_attention(folder)
    texts = [*TEXTS, " ".join(["a longer passage past the local window"] * 12)]
    _onnx_matches_eager(folder, texts)

    _refused_without(monkeypatch, tmp_path, folder, "band_bias", lambda *args: "")


@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_qwen3s_graph_groups_heads_and_masks_later_keys(
    monkeypatch, tmp_path: Path, attention: str
) -> None:  # type: ignore[no-untyped-def]
    """Qwen3's graph (RMSNorms, per-head q / k norms, rotary, 2 key-value heads for 4 query
    heads, causal or bidirectional as the folder says) gives the eager reference's vectors,
    alone as in a padded batch. The q / k norms' scales are raised (x8) so that attention
    depends on positions; a causal model's graph that lets queries see later keys is refused."""
    from embedserve.devtools.checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "qwen3", arch="qwen3-tiny", attention=attention,
                             dtype="float32", seed=5)  # fmt: skip
    _fill_qk_norms(folder, 8.0)
    _onnx_matches_eager(folder, [*TEXTS, " ".join(["a longer passage for a decoder"] * 12)])
    if attention == "causal":
        _refused_without(monkeypatch, tmp_path, folder, "causal_bias", lambda *args: "")


def test_gemma3s_graph_scales_norms_and_keeps_local_layers_in_their_window(
    monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """EmbeddingGemma's graph (embeddings scaled by sqrt(hidden), four RMSNorms of scale
    1 + weight per layer, 2 key-value heads for 4 query heads, scores scaled by
    query_pre_attn_scalar^-0.5, five local layers of window 8 to one global, GeGLU) gives the
    eager reference's vectors, alone as in a padded batch. The q / k norms' scales are raised
    (weight 3: scale 4; at 7 the two float32 paths part by 2e-5 on a 300-token probe) so that
    attention depends on positions; a graph whose local layers see every key is refused."""
    from embedserve.devtools.checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "gemma", arch="gemma3-tiny", dtype="float32", seed=5)
    _fill_qk_norms(folder, 3.0)
    _onnx_matches_eager(folder, [*TEXTS, " ".join(["a longer passage past the window"] * 12)])
    _refused_without(monkeypatch, tmp_path, folder, "band_bias", lambda *args: "")


def test_a_forward_past_the_longest_onnx_row_runs_the_torch_module(
    monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A batch holding a sequence over `LONGEST_ROW` tokens is run by the torch module the graph
    was written from (ONNX Runtime's attention would hold every head's [L, L] scores), on the
    session's threads; shorter batches stay on ONNX Runtime. Both give eager fp32's vectors."""
    from embedserve.devtools.checkpoints import make_checkpoint
    from embedserve.engine import onnx_encoder

    folder = make_checkpoint(tmp_path / "nomic", arch="nomic-bert-tiny", dtype="float32", seed=5)
    long = " ".join(["a passage longer than the row limit"] * 6)
    texts = ["a short query", long]
    expected = Embedder(folder, device="cpu", dtype="float32").encode(texts)
    onnx = Embedder(folder, device="cpu", cpu_path="onnx")
    encoder = onnx.engine.model
    assert isinstance(encoder, OnnxEncoder)
    monkeypatch.setattr(onnx_encoder, "LONGEST_ROW", 24)
    calls: list[tuple[int, int]] = []
    torch_forward = type(encoder._torch[0]).forward

    def counted(self, ids, *rest):  # type: ignore[no-untyped-def]
        calls.append((int(ids.numel()), torch.get_num_threads()))
        return torch_forward(self, ids, *rest)

    monkeypatch.setattr(type(encoder._torch[0]), "forward", counted)
    assert row_cosines(onnx.encode(texts[:1]), expected[:1]).min() >= cpu_paths.MIN_COSINE
    assert not calls
    kept = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = onnx.encode(texts)
    finally:
        torch.set_num_threads(kept)
    assert len(calls) == 1 and calls[0][1] == encoder.num_threads
    assert row_cosines(got, expected).min() >= cpu_paths.MIN_COSINE


@pytest.mark.parametrize(
    ("arch", "head_threads"),
    [("answerai-colbert-small-v1", {1}), ("splade-minilm-l6", {2})],
)
def test_small_heads_run_on_the_forwards_one_torch_thread(
    monkeypatch, retrieval_folder, arch: str, head_threads: set[int]
) -> None:  # type: ignore[no-untyped-def]
    """Behind ONNX Runtime's forward, ColBERT's projection runs on the forward's one torch
    thread (at two, the second OpenMP thread spins on the core the next session call needs);
    SPLADE's projection onto the vocabulary on every thread."""
    embedder = Embedder(retrieval_folder(arch), device="cpu", cpu_path="onnx")
    seen: list[int] = []
    heads = embedder.engine.retrieval
    assert heads is not None
    forward = type(heads).forward

    def counted(self, *args):  # type: ignore[no-untyped-def]
        seen.append(torch.get_num_threads())
        return forward(self, *args)

    monkeypatch.setattr(type(heads), "forward", counted)
    kept = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        embedder.encode_outputs(TEXTS)
        assert set(seen) == head_threads and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(kept)


@pytest.mark.parametrize("native_bf16", [False, True])
def test_float32_asked_with_auto_runs_the_choice_and_alone_runs_eager(
    monkeypatch: pytest.MonkeyPatch, minilm_path: Path, reference: np.ndarray, native_bf16: bool
) -> None:
    """`dtype="float32"` alone is the eager reference; with `cpu_path="auto"` the measured
    executor serves (here the remembered split), on a CPU with native bf16 as on one without;
    `cpu_path="auto"` with the default dtype changes nothing a bf16 CPU does."""
    monkeypatch.setattr(cpu, "native_bf16", lambda: native_bf16)
    cpu_paths.remember(cpu_paths.choice_key(str(minilm_path)), "onnx+packed@48")
    alone = Embedder(minilm_path, device="cpu", dtype="float32")
    assert alone.engine.cpu_choice is None and alone.engine.cpu_path == "eager"
    auto = Embedder(minilm_path, device="cpu", dtype="float32", cpu_path="auto")
    assert auto.engine.cpu_choice is not None and auto.engine.cpu_path == "onnx+packed"
    assert row_cosines(auto.encode(TEXTS), reference).min() >= cpu_paths.MIN_COSINE
    if native_bf16:  # the default stays bf16 (not built here: a CI CPU may emulate it)
        assert resolve_dtype(torch.device("cpu"), None, "auto") == ("bfloat16", False)
    else:
        default = Embedder(minilm_path, device="cpu", cpu_path="auto")
        assert default.engine.dtype_name == "float32"
        assert default.engine.cpu_path == "onnx+packed"
