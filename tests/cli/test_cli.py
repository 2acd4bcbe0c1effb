"""`embedserve embed`: arguments to JSON, files to .npy / .parquet, no silent overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embedserve.cli.embed_inputs import read_texts
from embedserve.cli.main import main
from embedserve.embedder import Embedder

# the CLI's vectors are compared with the float32 `minilm` fixture (the CPU default may be bf16)
FP32 = ("--dtype", "float32")


def test_embed_prints_json(minilm: Embedder, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["embed", *FP32, "hello world", "second", "--dimensions", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    got = np.array(out["embeddings"], dtype=np.float32)
    np.testing.assert_allclose(
        got, minilm.encode(["hello world", "second"], dimensions=8), atol=1e-6
    )


def test_embed_file_to_npy_and_parquet(minilm: Embedder, tmp_path: Path) -> None:
    src = tmp_path / "corpus.jsonl"
    src.write_text('{"text": "first doc"}\n\n"second doc"\n{"text": "third"}\n', encoding="utf-8")
    npy = tmp_path / "v.npy"
    assert main(["embed", *FP32, "--input", str(src), "--output", str(npy)]) == 0
    vectors = np.load(npy)
    np.testing.assert_allclose(
        vectors, minilm.encode(["first doc", "second doc", "third"]), atol=1e-6
    )

    import pyarrow.parquet as pq

    pq_path = tmp_path / "v.parquet"
    txt = tmp_path / "corpus.txt"
    txt.write_text("first doc\nsecond doc\n\nthird\n", encoding="utf-8")
    argv = ["embed", *FP32, "--input", str(txt), "--output", str(pq_path), "--output-dtype", "int8"]
    assert main(argv) == 2  # line 3 is empty: an error naming it
    assert main([*argv, "--skip-empty"]) == 0
    table = pq.read_table(pq_path)
    assert table.column("id").to_pylist() == [1, 2, 4]  # the line numbers: rows line up
    np.testing.assert_array_equal(
        np.array(table.column("embedding").to_pylist(), dtype=np.int8),
        np.round(vectors * 127).clip(-127, 127),
    )


def test_every_line_is_one_row_and_jsonl_ids_are_kept(
    minilm: Embedder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow.parquet as pq

    txt = tmp_path / "lines.txt"
    # whitespace-only text has no token of its own (WordPiece): refused as "" is, naming it
    txt.write_text("first\n   \nthird\n", encoding="utf-8")
    out = tmp_path / "v.npy"
    assert main(["embed", *FP32, "--input", str(txt), "--output", str(out)]) == 2
    said = capsys.readouterr().err  # the file and line, then the position (faults IV)
    assert f"{txt}:2 (input[1]) is empty after the tokenizer's normalization" in said
    txt.write_text("first\nsecond\nthird\n", encoding="utf-8")
    assert main(["embed", *FP32, "--input", str(txt), "--output", str(out)]) == 0
    np.testing.assert_allclose(np.load(out), minilm.encode(["first", "second", "third"]), atol=1e-6)
    txt.write_text("first\n\nthird\n", encoding="utf-8")
    assert main(["embed", *FP32, "--input", str(txt), "--output", str(out), "--overwrite"]) == 2
    assert "lines.txt:2: an empty text" in capsys.readouterr().err
    assert (
        main(
            [
                "embed",
                *FP32,
                "--input",
                str(txt),
                "--output",
                str(out),
                "--overwrite",
                "--skip-empty",
            ]
        )
        == 0
    )
    assert "skipped 1 empty lines: [2]" in capsys.readouterr().err
    src = tmp_path / "docs.jsonl"
    src.write_text(
        '{"id": "doc-a", "text": "alpha"}\n{"id": "doc-b", "text": "beta"}\n', encoding="utf-8"
    )
    pq_path = tmp_path / "v.parquet"
    assert main(["embed", *FP32, "--input", str(src), "--output", str(pq_path)]) == 0
    assert pq.read_table(pq_path).column("id").to_pylist() == ["doc-a", "doc-b"]


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


def test_output_and_input_are_checked_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from embedserve import embedder as embedder_module

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(embedder_module.Embedder, "__init__", no_model)
    src = tmp_path / "in.txt"
    src.write_text("a text\n", encoding="utf-8")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["--input", str(src), "--output", str(tmp_path / "nope" / "v.npy")], "does not exist"),
        (["--input", str(src), "--output", str(tmp_path)], "must end in .npy or .parquet"),
        (["--input", str(empty), "--output", str(tmp_path / "v.npy")], "no input files"),
        (["--input", str(tmp_path / "missing.txt")], "no input files"),
    ]
    for argv, words in cases:
        assert main(["embed", *argv]) == 2, argv
        assert words in capsys.readouterr().err, argv
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # not installed
    assert main(["embed", "--input", str(src), "--output", str(tmp_path / "v.parquet")]) == 2
    assert "pip install 'embedserve[parquet]'" in capsys.readouterr().err


def test_serve_on_a_taken_port_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"embedserve serve: error: port {port} on 127.0.0.1 is already in use (another "
        "server?): stop it, or pick another with --port (--port 0: any free port)"
    ]


def test_version_and_help_for_users(capsys: pytest.CaptureFixture[str]) -> None:
    from embedserve import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"embedserve {__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "embedserve serve " in out and "rerank" in out and "launch" not in out


def test_a_too_long_input_gets_the_flag_to_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["embed", "word " * 400, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "input[0] has 402 tokens, over this model's limit of 256" in err
    assert (
        "--truncate end (keep the beginning) or --truncate start" in err and "truncate=" not in err
    )


def test_a_native_integer_output_is_said_out_loud(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from embedserve.devtools.checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "pplx", arch="qwen3-tiny", attention="bidirectional")
    assert main(["embed", "hi", "--model", str(folder), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "native output is int8" in captured.err and "--output-dtype float32" in captured.err
    assert all(isinstance(x, int) for x in json.loads(captured.out)["embeddings"][0])


def test_key_help_strings_say_what_the_docs_say() -> None:
    """`--help` in step with docs/serving.md and the README: the truncate choices, the model
    kinds --model takes, TEI's gRPC port."""
    from pathlib import Path

    from embedserve.cli.main import build_parser

    root = Path(__file__).resolve().parents[2]
    serving = (root / "docs" / "serving.md").read_text(encoding="utf-8")
    readme = (root / "README.md").read_text(encoding="utf-8")
    sub = next(a for a in build_parser()._actions if a.choices and "embed" in a.choices).choices
    embed_help = " ".join(sub["embed"].format_help().split())
    assert "{end,start,chunk}" in embed_help and '`"chunk"`' in serving
    serve_help = " ".join(sub["serve"].format_help().split())
    assert "Hugging Face Hub id" in serve_help and "Hub" in readme
    assert "--tei-grpc-port" in serve_help and "--tei-grpc-port" in serving


def test_embed_reads_a_folder_or_glob_of_text_documents(
    minilm: Embedder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder's (or a glob's) .txt and .md files: each one document, its id its name; with
    --lines one text per line; an empty document is an error naming it, unless --skip-empty."""
    import pyarrow.parquet as pq

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("first document\nits second line", encoding="utf-8")
    (docs / "b.md").write_text("# notes\n\nsecond document", encoding="utf-8")
    (docs / "skip.csv").write_text("not read", encoding="utf-8")
    out = tmp_path / "v.parquet"
    assert main(["embed", "--input", str(docs), "--output", str(out), *FP32]) == 0
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == ["a.txt", "b.md"]
    want = minilm.encode(["first document\nits second line", "# notes\n\nsecond document"])
    np.testing.assert_allclose(np.array(table.column("embedding").to_pylist()), want, atol=1e-5)
    lines = tmp_path / "l.parquet"
    assert main(["embed", "--input", str(docs / "*.txt"), "--lines", "--output", str(lines)]) == 0
    glob_table = pq.read_table(lines)
    assert glob_table.num_rows == 2
    assert glob_table.column("id").to_pylist() == [f"{docs / 'a.txt'}:1", f"{docs / 'a.txt'}:2"]
    (docs / "c.txt").write_text("", encoding="utf-8")
    capsys.readouterr()
    assert main(["embed", "--input", str(docs), "--output", str(out), "--overwrite"]) == 2
    assert "c.txt: an empty document" in capsys.readouterr().err
    args = ["embed", "--input", str(docs), "--output", str(out), "--overwrite", "--skip-empty"]
    assert main(args) == 0
    assert "skipped 1 empty texts: ['c.txt']" in capsys.readouterr().err
