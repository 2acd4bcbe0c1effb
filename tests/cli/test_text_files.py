"""Text inputs split at newlines only (faults IV): `embed --input` and `index --lines` read a
file of N lines as N texts whatever other line separators Unicode knows, JSONL lines holding them
stay whole, and a byte-order mark is not text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embedserve.cli.embed_inputs import read_records
from embedserve.indexing.files import split_lines, text_lines

# U+2028 LINE SEPARATOR, U+0085 NEXT LINE, a form feed, U+2029: str.splitlines splits at each
ODD = ["one\u2028two", "three\x85four", "page\x0cbreak", "para\u2029graph"]


def test_a_txt_file_of_four_lines_is_four_texts(tmp_path: Path) -> None:
    path = tmp_path / "texts.txt"
    path.write_bytes(("\ufeff" + "\r\n".join(ODD) + "\r\n").encode())
    records = read_records(path)
    assert records.texts == ODD and records.ids == [1, 2, 3, 4]


def test_a_jsonl_line_holding_raw_separators_is_one_record(tmp_path: Path) -> None:
    path = tmp_path / "texts.jsonl"
    lines = [json.dumps({"id": f"r{i}", "text": t}, ensure_ascii=False) for i, t in enumerate(ODD)]
    path.write_bytes(("\ufeff" + "\n".join(lines)).encode())
    records = read_records(path)
    assert records.texts == ODD and records.ids == ["r0", "r1", "r2", "r3"]


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt: not UTF-8 text"):
        read_records(path)


def test_index_lines_split_the_same_way() -> None:
    data = ("\ufeff" + "\n".join(ODD) + "\n").encode()
    batch = {"bytes": np.array([data], dtype=object), "path": np.array(["/x/a.txt"], dtype=object)}
    rows = text_lines(batch)
    assert list(rows["text"]) == ODD
    assert list(rows["id"]) == ["a.txt:1", "a.txt:2", "a.txt:3", "a.txt:4"]


@pytest.mark.parametrize(
    ("text", "lines"),
    [("", []), ("a", ["a"]), ("a\n", ["a"]), ("a\n\nb", ["a", "", "b"]), ("a\r\nb\r", ["a", "b"])],
)
def test_split_lines(text: str, lines: list[str]) -> None:
    assert split_lines(text) == lines


def test_skip_empty_leaves_out_whitespace_and_a_lone_md_is_one_document(tmp_path: Path) -> None:
    from embedserve.cli.embed_inputs import read_inputs

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# Title\n\nbody line\n")
    (notes / "blank.md").write_text("  \n\t\n")
    folder = read_inputs(notes, skip_empty=True)
    assert folder.ids == ["a.md"] and folder.skipped == ["blank.md"]
    lone = read_inputs(notes / "a.md")
    assert lone.texts == ["# Title\n\nbody line\n"] and len(lone.ids) == 1
    by_line = read_inputs(notes / "a.md", skip_empty=True, lines=True)
    assert by_line.texts == ["# Title", "body line"]
    txt = tmp_path / "t.txt"
    txt.write_text("one\n   \ntwo\n")
    records = read_records(txt, skip_empty=True)
    assert records.texts == ["one", "two"] and records.skipped == [2]


def test_an_error_names_the_file_and_line_not_the_position(tmp_path: Path) -> None:
    import argparse

    from embedserve.cli.embed_inputs import Records, named_where

    records = Records(ids=["a.md", "b.jsonl:7"], texts=["x", "y"])
    args = argparse.Namespace(input=tmp_path)
    said = named_where("input[1] is empty after the tokenizer's normalization", records, args)
    assert said.startswith(f"{tmp_path}/b.jsonl:7 (input[1])")
    assert named_where("input[1] x", records, argparse.Namespace(input=None)) == "input[1] x"
