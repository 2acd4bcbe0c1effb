"""The offline API: input checks, options, encodings, token-id input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from embedserve.embedder import Embedder
from embedserve.loading.spec import ModelLoadError


@pytest.mark.parametrize(
    ("inputs", "error", "words"),
    [
        ("", ValueError, "empty string"),
        ([], ValueError, "input is an empty list"),
        (["ok", ""], ValueError, r"input\[1\] is an empty string"),
        (["ok", 3], TypeError, r"input\[1\] is int"),
        ([None], TypeError, r"input\[0\] is NoneType"),
        ([["nested"]], TypeError, r"input\[0\] must hold integer token ids only, found str"),
        ([[101, 999999, 102]], ValueError, "token id 999999 is outside the vocabulary"),
        ([[101, -1, 102]], ValueError, "token id -1"),
    ],
)
def test_bad_inputs(minilm: Embedder, inputs: object, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        minilm.encode(inputs)  # type: ignore[arg-type]


@pytest.mark.parametrize("dims", [0, -1, 385, 10_000])
def test_bad_dimensions(minilm: Embedder, dims: int) -> None:
    with pytest.raises(ValueError, match="dimensions must be between 1 and 384"):
        minilm.encode(["x"], dimensions=dims)


def test_bad_options(minilm: Embedder) -> None:
    with pytest.raises(ValueError, match="output_dtype 'int4'"):
        minilm.encode(["x"], output_dtype="int4")
    with pytest.raises(ValueError, match="multiple of 8"):
        minilm.encode(["x"], dimensions=100, output_dtype="binary")
    with pytest.raises(ValueError, match="truncate must be"):
        minilm.encode(["x"], truncate="middle")  # type: ignore[arg-type]
    # the value as the HTTP client wrote it (JSON), not Python's True
    with pytest.raises(ValueError, match=r'or "chunk"; got true$'):
        minilm.encode(["x"], truncate=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prompt_name 'query': this model has no prompts"):
        minilm.encode(["x"], prompt_name="query")


def test_too_long_needs_truncate(minilm: Embedder) -> None:
    long_text = "word " * 400
    with pytest.raises(
        ValueError, match=r"input\[1\] has \d+ tokens, over this model's limit of 256"
    ):
        minilm.encode(["short", long_text])
    end = minilm.encode([long_text], truncate="end")
    start = minilm.encode([long_text + " tail different words here"], truncate="start")
    assert end.shape == start.shape == (1, 384)
    with pytest.raises(ValueError, match="over this model's limit of 256"):
        minilm.encode([[101] + [2000] * 300 + [102]])
    assert minilm.encode([[101] + [2000] * 300 + [102]], truncate="end").shape == (1, 384)


def test_unknown_model_name() -> None:
    with pytest.raises(ValueError, match="neither a bundled name"):
        Embedder("no-such-model")


def test_folder_without_weights(minilm_path: Path, tmp_path: Path) -> None:
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(minilm_path / name, tmp_path / name)
    with pytest.raises(ModelLoadError, match="no weights; expected model.safetensors"):
        Embedder(tmp_path)


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="config.json: file not found"):
        Embedder(tmp_path)


def test_unsupported_architecture(minilm_path: Path, tmp_path: Path) -> None:
    cfg = json.loads((minilm_path / "config.json").read_text())
    cfg.update(architectures=["T5EncoderModel"], model_type="t5")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelLoadError, match="unsupported architecture 'T5EncoderModel'.*supported: "
    ):
        Embedder(tmp_path)


def test_mismatched_tensor_shape(minilm_path: Path, tmp_path: Path) -> None:
    shutil.copytree(minilm_path, tmp_path, dirs_exist_ok=True)
    cfg = json.loads((minilm_path / "config.json").read_text())
    cfg["intermediate_size"] = 1024
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelLoadError,
        match=r"intermediate.dense.weight' has shape \[1536, 384\], expected \[1024, 384\]",
    ):
        Embedder(tmp_path)


def test_sharded_checkpoint_loads_the_same(
    minilm: Embedder, minilm_path: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    for f in minilm_path.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, tmp_path / f.name)
    (tmp_path / "1_Pooling").mkdir()
    shutil.copy(minilm_path / "1_Pooling" / "config.json", tmp_path / "1_Pooling" / "config.json")
    tensors = load_file(str(minilm_path / "model.safetensors"))
    names = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for shard, keys in halves.items():
        save_file({k: tensors[k].contiguous() for k in keys}, str(tmp_path / shard))
        weight_map.update(dict.fromkeys(keys, shard))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    texts = ["sharded weights", "load the same"]
    np.testing.assert_array_equal(
        Embedder(tmp_path, device="cpu", dtype="float32").encode(texts), minilm.encode(texts)
    )


def test_dimensions_truncate_then_normalize(minilm: Embedder) -> None:
    full = minilm.encode(["matryoshka"], normalize=False)[0]
    short = minilm.encode(["matryoshka"], dimensions=64)[0]
    assert short.shape == (64,)
    np.testing.assert_allclose(short, full[:64] / np.linalg.norm(full[:64]), rtol=1e-6)


def test_output_encodings_follow_the_documented_rules(minilm: Embedder) -> None:
    texts = ["int8 and binary", "quantized outputs"]
    f = minilm.encode(texts)
    np.testing.assert_array_equal(
        minilm.encode(texts, output_dtype="float16"), f.astype(np.float16)
    )
    i8 = minilm.encode(texts, output_dtype="int8")
    assert i8.dtype == np.int8
    np.testing.assert_array_equal(i8, np.clip(np.rint(f * 127), -127, 127).astype(np.int8))
    u8 = minilm.encode(texts, output_dtype="uint8")
    np.testing.assert_array_equal(u8.astype(np.int16) - 128, i8)
    ub = minilm.encode(texts, output_dtype="ubinary")
    assert ub.shape == (2, 48) and ub.dtype == np.uint8
    # first dimension in the most significant bit
    assert ((ub[:, 0] >> 7) & 1).tolist() == (f[:, 0] > 0).astype(int).tolist()
    np.testing.assert_array_equal(np.unpackbits(ub, axis=1).astype(bool), f > 0)
    b = minilm.encode(texts, output_dtype="binary")
    np.testing.assert_array_equal(b.astype(np.int16) + 128, ub)


def test_token_ids_equal_text(minilm: Embedder) -> None:
    text = "token ids in, same vector out"
    ids = minilm.tokenize([text])[0]
    np.testing.assert_array_equal(minilm.encode([ids]), minilm.encode([text]))
    np.testing.assert_array_equal(minilm.encode([np.array(ids)]), minilm.encode([text]))


def test_single_string_gives_one_vector(minilm: Embedder) -> None:
    assert minilm.encode("one").shape == (384,)


def test_progress_bar_and_order(minilm: Embedder, capsys: pytest.CaptureFixture[str]) -> None:
    texts = [f"text number {i}" for i in range(50)]
    a = minilm.encode(texts, batch_tokens=64, show_progress=True)
    b = np.stack([minilm.encode(t) for t in texts[:5]])
    np.testing.assert_allclose(a[:5], b, atol=1e-6)
    assert "embedding" in capsys.readouterr().err


def test_tokenizing_overlapped_with_the_engine_gives_the_same_rows_and_errors(
    minilm: Embedder, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CUDA path (pieces tokenized on a thread while the engine runs the piece before),
    forced on the CPU with pieces of 3 texts."""
    from embedserve import embedder as embedder_module
    from embedserve.errors import InputTooLong

    texts = [f"passage {i}: " + "a few words " * (i % 7) for i in range(10)]
    texts[4] = "a long one " * 300  # windows with truncate="chunk"
    want = minilm.encode(texts, truncate="chunk")
    monkeypatch.setattr(embedder_module, "OVERLAP_PIECE_TEXTS", 3)
    monkeypatch.setattr(minilm, "overlap_tokenizing", True)
    got = minilm.encode(texts, truncate="chunk", show_progress=True)
    # other batches (text 9 is alone in its piece): equal up to float32 summation order
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert "embedding" in capsys.readouterr().err
    texts[7] = texts[4]  # over the limit without truncation: the caller's index, not the piece's
    with pytest.raises(InputTooLong, match=r"input\[4\] has \d+ tokens"):
        minilm.encode(texts)
    texts[4] = "short"
    with pytest.raises(InputTooLong, match=r"input\[7\] has \d+ tokens"):
        minilm.encode(texts)


def test_two_threads_through_one_embedder_get_their_own_vectors(minilm_path: Path) -> None:
    """The graphs' buffers (static inputs, a bucket's output) are shared by every caller of one
    engine: here through the CPU stand-in graphs (`graphs.EagerGraph`), which share them as
    CUDA graphs do. Both threads' batches land in one bucket (t64-s4-l64)."""
    import threading

    import torch

    from embedserve.engine.graphs import EagerGraph, GraphConfig, GraphRunner

    embedder = Embedder(minilm_path, device="cpu", dtype="float32")
    engine = embedder.engine
    texts = {
        "a": ["the cat sat on the mat", "a short query about rust"],
        "b": ["quarterly revenue grew by nine percent", "how do volcanoes form"],
    }
    want = {k: embedder.encode(v) for k, v in texts.items()}  # eager, before any graph
    engine.runner = GraphRunner(
        engine._forward,
        device=torch.device("cpu"),
        config=GraphConfig(attention=("block_mask",)),
        stats=engine.stats,
        choices=engine.choices,
        max_positions=engine.max_positions,
        make_graph=EagerGraph,
    )
    wrong: list[str] = []
    start = threading.Barrier(2)

    def encode(key: str) -> None:
        start.wait()
        for _ in range(40):
            got = embedder.encode(texts[key])
            if not np.allclose(got, want[key], atol=1e-5, rtol=0):
                wrong.append(key)

    threads = [threading.Thread(target=encode, args=(k,)) for k in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert engine.stats.replays > 0  # the shared bucket was captured and replayed
    assert not wrong, f"{len(wrong)} of 80 encodes got another thread's vectors"


def test_batches_are_cut_by_length_and_rows_come_back_in_order() -> None:
    """`run_batches` cuts its batches from the sequences sorted by length (an executor that pads
    pads little), and each row lands where its sequence was."""
    from types import SimpleNamespace

    from embedserve.embedder import run_batches

    batches: list[list[int]] = []

    def step(batch):  # type: ignore[no-untyped-def]
        lengths = batch.seqlens.tolist()
        batches.append(lengths)
        rows = np.array([[n, batch.input_ids[sum(lengths[:i])]] for i, n in enumerate(lengths)])
        return SimpleNamespace(wait=lambda: rows.astype(np.float32))

    engine = SimpleNamespace(step=step, output_width=2)
    rng = np.random.default_rng(0)
    seqs = [[k] * int(n) for k, n in enumerate(rng.integers(1, 60, size=40))]
    out = run_batches(engine, seqs, batch_tokens=100)  # type: ignore[arg-type]
    assert out.tolist() == [[len(s), s[0]] for s in seqs]
    flat = [n for b in batches for n in b]
    assert flat == sorted(len(s) for s in seqs)
    assert all(sum(b) <= 100 for b in batches) and len(batches) > 5


def test_contextual_batches_cut_by_length_give_each_document_its_chunks(minilm: Embedder) -> None:
    """Whole documents in batches cut from the documents sorted by length: each document's
    chunk vectors are where the document was, as when it runs alone."""
    documents = [
        ["A longer document about the Roman empire.", "Its roads, its laws, its decline."],
        ["short"],
        ["The Eiffel Tower is in Paris.", "It is 330 metres tall.", "Built in 1889."],
        ["ok", "fine"],
    ]
    together = minilm.encode_contextual(documents, batch_tokens=24)
    for document, rows in zip(documents, together, strict=True):
        [alone] = minilm.encode_contextual([document])
        assert rows.shape == (len(document), alone.shape[1])
        np.testing.assert_allclose(rows, alone, atol=1e-5)
