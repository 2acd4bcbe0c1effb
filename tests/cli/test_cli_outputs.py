"""`embedserve embed --outputs`: bge-m3's dense, sparse and multi-vector outputs (and SPLADE's
sparse by default) as JSON and Parquet columns, equal to `Embedder.encode_outputs` on the same
folder; the errors of a wrong output name and of a .npy file for them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embedserve.cli.main import main
from embedserve.embedder import Embedder
from embedserve.retrieval import runner
from embedserve.retrieval.columns import read_multivector, read_sparse

pq = pytest.importorskip("pyarrow.parquet")

TEXTS = [
    "what is late interaction retrieval?",
    "SPLADE expands queries and documents over the vocabulary, with weights.",
    "Zürich, 東京 and São Paulo",
    "short",
    " ".join(["a passage of some length about sparse and dense retrieval models"] * 6),
]


def assert_same_sparse(
    got: list[dict],  # type: ignore[type-arg]
    want: list[dict],  # type: ignore[type-arg]
    rtol: float = 1e-6,
    atol: float = 1e-7,
) -> None:
    """The same token ids, the same weights: the file holds what `encode_outputs` returned (a
    batch of other inputs around a text, as in `index`, moves fp32 sums by ~1e-6)."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a["indices"] == b["indices"]
        np.testing.assert_allclose(a["values"], b["values"], rtol=rtol, atol=atol)


def assert_same_multivector(
    got: list[np.ndarray], want: list[np.ndarray], atol: float = 1e-6
) -> None:
    assert [g.shape for g in got] == [w.shape for w in want]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=atol)


@pytest.fixture(scope="module")
def bge_m3(retrieval_folder) -> Embedder:  # type: ignore[no-untyped-def]
    return Embedder(retrieval_folder("bge-m3-tiny"), device="cpu", dtype="float32")


def test_parquet_columns_equal_encode_outputs(
    bge_m3: Embedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in
                           enumerate(TEXTS)), encoding="utf-8")  # fmt: skip
    out = tmp_path / "v.parquet"
    # pieces of two texts: a file is written as several row groups, in order
    monkeypatch.setattr(runner, "PIECE_TEXTS", 2)
    argv = ["embed", "--model", str(bge_m3.spec.path), "--device", "cpu", "--dtype", "float32", "--input", str(src),
            "--output", str(out), "--outputs", "dense,sparse,multivector"]  # fmt: skip
    assert main(argv) == 0
    file = pq.ParquetFile(out)
    assert file.metadata.num_row_groups == 3
    table = file.read()
    assert table.column_names == ["id", "embedding", "sparse_indices", "sparse_values",
                                  "multivector"]  # fmt: skip
    assert str(table.schema.field("sparse_indices").type) == "list<element: int32>"
    assert str(table.schema.field("sparse_values").type) == "list<element: float>"
    dims = bge_m3.multivector_dims
    assert table.schema.field("multivector").type.value_type.list_size == dims
    assert table["id"].to_pylist() == [f"d{i}" for i in range(len(TEXTS))]
    want = bge_m3.encode_outputs(TEXTS)
    assert want.dense is not None and want.sparse is not None and want.multivector is not None
    np.testing.assert_allclose(np.array(table["embedding"].to_pylist()), want.dense, atol=1e-6)
    assert_same_sparse(read_sparse(table), want.sparse)
    assert_same_multivector(read_multivector(table), want.multivector)


def test_json_and_the_default_outputs(
    bge_m3: Embedder,
    retrieval_folder,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    model = ["--model", str(bge_m3.spec.path), "--device", "cpu", "--dtype", "float32"]
    assert main(["embed", *TEXTS[:2], *model, "--outputs", "sparse,multivector"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"model", "sparse", "multivector"}
    want = bge_m3.encode_outputs(TEXTS[:2], outputs=("sparse", "multivector"))
    assert want.sparse is not None and want.multivector is not None
    assert_same_sparse(doc["sparse"], want.sparse)
    assert_same_multivector([np.array(m, np.float32) for m in doc["multivector"]],
                            want.multivector)  # fmt: skip
    # bge-m3 has dense vectors: they are the default, as before
    assert main(["embed", *TEXTS[:2], *model]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"model", "embeddings"}
    np.testing.assert_allclose(doc["embeddings"], bge_m3.encode(TEXTS[:2]), atol=1e-6)
    # SPLADE has none: its sparse vectors are
    splade = retrieval_folder("splade-minilm-l6")
    assert (
        main(["embed", *TEXTS[:2], "--model", str(splade), "--device", "cpu", "--dtype", "float32"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"model", "sparse"}
    expected = Embedder(splade, device="cpu", dtype="float32").encode_outputs(TEXTS[:2]).sparse
    assert expected is not None
    assert_same_sparse(doc["sparse"], expected)


def test_wrong_outputs_and_npy_are_refused_before_the_model_loads(
    bge_m3: Embedder,
    retrieval_folder,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    model = ["--model", str(bge_m3.spec.path), "--device", "cpu", "--dtype", "float32"]
    assert main(["embed", "x", *model, "--outputs", "dense,colbert"]) == 2
    err = capsys.readouterr().err
    assert "outputs must be a non-empty list of dense, sparse, multivector" in err
    assert "'colbert'" in err
    npy = tmp_path / "v.npy"
    assert main(["embed", "x", *model, "--outputs", "sparse", "--output", str(npy)]) == 2
    assert "a .npy file holds dense vectors only; write .parquet" in capsys.readouterr().err
    assert not npy.exists()
    splade = retrieval_folder("splade-minilm-l6")
    assert main(["embed", "x", "--model", str(splade), "--outputs", "dense"]) == 2
    assert "what this model has" in capsys.readouterr().err


def test_pieces_halve_under_the_multivector_limit_and_errors_keep_their_index(
    bge_m3: Embedder,
) -> None:
    from functools import partial

    calls: list[int] = []
    texts = ["one two three four five six seven eight nine ten"] * 5
    vectors = len(bge_m3.tokenize(texts[0])[0]) - 1  # bge-m3: one per token after CLS

    def encode(texts):  # type: ignore[no-untyped-def]
        calls.append(len(texts))
        # a limit that holds exactly two of these texts' vectors
        return bge_m3.encode_outputs(texts, outputs=("multivector",),
                                     max_multivector_values=2 * vectors * bge_m3.multivector_dims)  # fmt: skip

    pieces = list(runner.encode_in_pieces(encode, texts, piece=4))
    # 4 is over, halved to 2; then 3 (what is left, up to 4) over, 2; then the last one
    assert [s for s, _ in pieces] == [0, 2, 4] and calls == [4, 2, 3, 2, 1]
    got = [m for _, out in pieces for m in out.multivector or []]
    assert_same_multivector(got, bge_m3.encode_outputs(texts, outputs=("multivector",))
                            .multivector or [])  # fmt: skip
    long = ["short"] * 3 + [" ".join(["word"] * 9000)]
    from embedserve.errors import InputTooLong

    with pytest.raises(InputTooLong, match=r"^input\[3\] has"):
        list(runner.encode_in_pieces(partial(bge_m3.encode_outputs, outputs=("sparse",)),
                                     long, piece=2))  # fmt: skip
