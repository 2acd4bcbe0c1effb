"""`embedserve index` with sparse and multi-vector outputs: bge-m3's three outputs (and SPLADE's
sparse vectors, its default) in the columns of `retrieval.columns`, equal to
`Embedder.encode_outputs` on the same folder, bad records reported; the job resumes, and a rerun
asking for other outputs is refused naming them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")
pq = pytest.importorskip("pyarrow.parquet")

from embedserve.embedder import Embedder  # noqa: E402
from embedserve.indexing.identity import differences, vectors_identity  # noqa: E402
from embedserve.indexing.job import IndexOptions, run_index  # noqa: E402
from embedserve.retrieval.columns import read_multivector, read_sparse  # noqa: E402
from tests.cli.test_cli_outputs import TEXTS, assert_same_multivector, assert_same_sparse  # noqa: E402
from tests.indexing.test_indexing import write_jsonl  # noqa: E402


def read_table(out: Path):  # type: ignore[no-untyped-def]
    import pyarrow as pa

    return pa.concat_tables(pq.read_table(f) for f in sorted(out.glob("*.parquet")))


def test_index_writes_the_outputs_asked_for_and_resumes(tmp_path: Path, retrieval_folder) -> None:  # type: ignore[no-untyped-def]
    corpus, out = tmp_path / "in", tmp_path / "out"
    corpus.mkdir()
    records = [{"id": f"r{i}", "text": TEXTS[i % len(TEXTS)]} for i in range(23)]
    records[4] = {"id": "r4", "text": ""}
    # over the limit: its batch is embedded one record at a time (`actor._one_by_one`)
    records[9] = {"id": "r9", "text": " ".join(["word"] * 9000)}
    write_jsonl(corpus / "part.jsonl", records)
    folder = retrieval_folder("bge-m3-tiny")
    # batches of 8 records in pieces of up to 64 texts: several batches per file
    options = IndexOptions(model=str(folder), device="cpu", dtype="float32", batch_size=8,
                           outputs=("dense", "sparse", "multivector"))  # fmt: skip
    summary = run_index(corpus, out, options, log=lambda line: None)
    assert (summary["records"], summary["errors"]) == (21, 2)
    errors = (out / "part.errors.jsonl").read_text()
    assert '"r9"' in errors and "over this model's limit of 8192" in errors
    table = read_table(out)
    assert table.column_names == ["id", "vector", "sparse_indices", "sparse_values",
                                  "multivector", "model", "dims", "output_dtype"]  # fmt: skip
    ids = table["id"].to_pylist()
    assert ids == [f"r{i}" for i in range(23) if i not in (4, 9)]
    texts = [TEXTS[int(i[1:]) % len(TEXTS)] for i in ids]
    ours = Embedder(folder, device="cpu", dtype="float32")
    want = ours.encode_outputs(texts)
    assert want.dense is not None and want.sparse is not None and want.multivector is not None
    np.testing.assert_allclose(np.array(table["vector"].to_pylist()), want.dense, atol=1e-5)
    assert_same_sparse(read_sparse(table), want.sparse, rtol=1e-5, atol=1e-6)
    assert_same_multivector(read_multivector(table), want.multivector, atol=1e-5)
    assert summary["tokens"] == sum(want.tokens or [])
    # done: the second run skips it; other outputs are refused, naming them
    assert run_index(corpus, out, options, log=lambda line: None)["skipped"] == 1
    dense = replace(options, outputs=("dense",))
    with pytest.raises(ValueError, match=r"outputs: \['dense', 'sparse', 'multivector'\] \(this "
                       r"run: \['dense'\]\)"):  # fmt: skip
        run_index(corpus, out, dense, log=lambda line: None)
    with pytest.raises(ValueError, match="outputs must be a non-empty list of dense, sparse"):
        run_index(corpus, out, replace(options, outputs=("colbert",)), log=lambda line: None)


def test_a_sparse_model_writes_its_sparse_vectors_by_default(
    tmp_path: Path,
    retrieval_folder,  # type: ignore[no-untyped-def]
) -> None:
    corpus, out = tmp_path / "in", tmp_path / "out"
    corpus.mkdir()
    write_jsonl(corpus / "part.jsonl", [{"id": f"s{i}", "text": t} for i, t in enumerate(TEXTS)])
    folder = retrieval_folder("splade-minilm-l6")
    summary = run_index(corpus, out, IndexOptions(model=str(folder), device="cpu", dtype="float32"),
                        log=lambda line: None)  # fmt: skip
    assert summary["records"] == len(TEXTS)
    table = read_table(out)
    assert "vector" not in table.column_names and "multivector" not in table.column_names
    want = Embedder(folder, device="cpu", dtype="float32").encode_outputs(TEXTS).sparse
    assert want is not None
    assert_same_sparse(read_sparse(table), want, rtol=1e-5, atol=1e-6)


def test_folders_of_older_runs_held_dense_vectors(minilm_path: Path) -> None:
    """A manifest written before outputs were recorded made dense vectors: not a difference."""
    now = vectors_identity(IndexOptions(model=str(minilm_path), device="cpu", dtype="float32"), 0)
    assert now["outputs"] == ["dense"]
    older = {k: v for k, v in now.items() if k != "outputs"}
    assert differences(older, now) == []
    sparse = {**now, "outputs": ["sparse"]}
    assert differences(older, sparse) == ["outputs: ['dense'] (this run: ['sparse'])"]
