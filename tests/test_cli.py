"""`embedserve embed`: arguments to JSON, files to .npy / .parquet, no silent overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embedserve.cli import main, read_texts
from embedserve.embedder import Embedder


def test_embed_prints_json(minilm: Embedder, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["embed", "hello world", "second", "--dimensions", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    got = np.array(out["embeddings"], dtype=np.float32)
    np.testing.assert_allclose(
        got, minilm.encode(["hello world", "second"], dimensions=8), atol=1e-6
    )


def test_embed_file_to_npy_and_parquet(minilm: Embedder, tmp_path: Path) -> None:
    src = tmp_path / "corpus.jsonl"
    src.write_text('{"text": "first doc"}\n\n"second doc"\n{"text": "third"}\n', encoding="utf-8")
    npy = tmp_path / "v.npy"
    assert main(["embed", "--input", str(src), "--output", str(npy)]) == 0
    vectors = np.load(npy)
    np.testing.assert_allclose(
        vectors, minilm.encode(["first doc", "second doc", "third"]), atol=1e-6
    )

    import pyarrow.parquet as pq

    pq_path = tmp_path / "v.parquet"
    txt = tmp_path / "corpus.txt"
    txt.write_text("first doc\nsecond doc\n\nthird\n", encoding="utf-8")
    assert (
        main(["embed", "--input", str(txt), "--output", str(pq_path), "--output-dtype", "int8"])
        == 0
    )
    column = pq.read_table(pq_path).column("embedding").to_pylist()
    np.testing.assert_array_equal(
        np.array(column, dtype=np.int8), np.round(vectors * 127).clip(-127, 127)
    )


def test_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "v.npy"
    out.write_bytes(b"precious")
    assert main(["embed", "x", "--output", str(out)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_bytes() == b"precious"
    assert main(["embed", "x", "--output", str(out), "--overwrite"]) == 0
    assert np.load(out).shape == (1, 384)


def test_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["embed"]) == 2
    assert "give texts as arguments or --input" in capsys.readouterr().err
    assert main(["embed", "x", "--output", str(tmp_path / "v.csv")]) == 2
    assert "must end in .npy or .parquet" in capsys.readouterr().err
    assert main(["embed", "x", "--model", "nope"]) == 2
    assert "neither a bundled name" in capsys.readouterr().err
    assert main(["embed", "word " * 300]) == 2
    assert "over this model's limit of 256" in capsys.readouterr().err


def test_read_texts_reports_bad_jsonl_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{broken\n', encoding="utf-8")
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        read_texts(bad)


def test_rerank_prints_the_ranked_documents(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from embedserve.scorer import Scorer

    docs = ["Rerankers score query and document pairs.", "The weather in Lisbon.", "Vectors."]
    query = "how do rerankers work"
    want = Scorer("minilm", device="cpu").score(query, docs)
    assert main(["rerank", "--query", query, *docs, "--device", "cpu", "--top-n", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scoring"] == "bi-encoder"
    assert [r["index"] for r in out["results"]] == list(np.argsort(-want)[:2])
    assert out["results"][0]["relevance_score"] == pytest.approx(float(want.max()), abs=1e-5)
    src = tmp_path / "docs.txt"
    src.write_text("\n".join(docs), encoding="utf-8")
    assert main(["rerank", "--query", query, "--input", str(src), "--device", "cpu"]) == 0
    assert len(json.loads(capsys.readouterr().out)["results"]) == 3
    assert main(["rerank", "--query", "", "doc", "--device", "cpu"]) == 2
    assert "query is an empty string" in capsys.readouterr().err
