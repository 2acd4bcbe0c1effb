"""`embedserve embed`'s inputs: the texts of `--input` (a .txt or .jsonl file, a .md document, a
folder or glob of them) with each record's id, and errors named by file and line."""

from __future__ import annotations

import argparse
import glob
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Records:
    """The texts of an input file, one per record, with each record's id (the jsonl `id`, else
    its line number) and the line numbers skipped as empty (only with `--skip-empty`)."""

    ids: list[Any] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    skipped: list[Any] = field(default_factory=list)  # line numbers (FILE:LINE, or a file)


def read_records(path: Path, *, skip_empty: bool = False) -> Records:
    """A .txt file (every line one text: an empty line is an error naming it unless
    `skip_empty`, which leaves out lines of whitespace alone too) or a .jsonl file (a string or an object with a 'text'
    string and an optional 'id' per line; blank lines are not records)."""
    from embedserve.indexing.files import split_lines

    out = Records()
    try:
        lines = split_lines(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    for n, line in enumerate(lines, 1):
        if path.suffix == ".jsonl":
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            text = record.get("text") if isinstance(record, dict) else record
            if not isinstance(text, str):
                raise ValueError(f"{path}:{n}: expected a string or an object with a 'text' string")
            record_id = record.get("id", n) if isinstance(record, dict) else n
        else:
            text, record_id = line, n
        if not text or (skip_empty and text.isspace()):
            # whitespace alone has no token of its own for most tokenizers: the core refuses it
            if not skip_empty:
                raise ValueError(
                    f"{path}:{n}: an empty text; remove the line, or pass --skip-empty to leave "
                    "it out (the skipped line numbers are reported)"
                )
            out.skipped.append(n)
            continue
        out.ids.append(record_id)
        out.texts.append(text)
    return out


def read_texts(path: Path) -> list[str]:
    """The texts of an input file (see `read_records`)."""
    return read_records(path).texts


TEXT_SUFFIXES = (".txt", ".md")  # in a folder or glob: a document per file, or --lines
FOLDER_SUFFIXES = (*TEXT_SUFFIXES, ".jsonl")


def input_paths(spec: Path) -> list[Path]:
    """The files of `--input`: the file itself, or a folder's / a glob's .txt, .md and .jsonl
    files, sorted; an error naming what was expected when there are none."""
    if spec.is_file():
        return [spec]
    if spec.is_dir():
        found = sorted(p for p in spec.iterdir() if p.is_file())
    else:
        found = sorted(Path(p) for p in glob.glob(str(spec), recursive=True))
    files = [p for p in found if p.suffix in FOLDER_SUFFIXES and p.is_file()]
    if not files:
        raise ValueError(
            f"--input {spec}: no input files (expected a .txt or .jsonl file, or a folder or "
            "glob of .txt, .md and .jsonl files)"
        )
    return files


def read_inputs(spec: Path, *, skip_empty: bool = False, lines: bool = False) -> Records:
    """The records of `--input`: one file as `read_records` reads it; a folder or glob's files
    in order, each .txt / .md one document (its id the file's name under the folder; empty: an
    error unless `skip_empty`) or with `lines` one text per line, and each .jsonl's records;
    their ids and skipped lines are `FILE:ID` / `FILE:LINE`."""
    paths = input_paths(spec)
    # a lone .md is one document, as it is in a folder and in `index` (a .txt: one text a line)
    if spec.is_file() and (spec.suffix != ".md" or lines):
        return read_records(spec, skip_empty=skip_empty)
    out = Records()
    for path in paths:
        name = str(path.relative_to(spec)) if spec.is_dir() else str(path)
        if path.suffix in TEXT_SUFFIXES and not lines:
            try:
                text = path.read_text(encoding="utf-8-sig")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            if not text and not skip_empty:
                raise ValueError(
                    f"{path}: an empty document; remove the file, or pass --skip-empty to leave "
                    "it out (the skipped files are reported)"
                )
            if text and not (skip_empty and text.isspace()):
                out.ids.append(name)
                out.texts.append(text)
            else:
                out.skipped.append(name)
            continue
        records = read_records(path, skip_empty=skip_empty)
        out.ids += [f"{name}:{i}" for i in records.ids]
        out.texts += records.texts
        out.skipped += [f"{name}:{n}" for n in records.skipped]
    return out


def check_input(path: Path) -> None:
    input_paths(path)  # an error when it names no input file


def named_where(message: str, records: Records, args: argparse.Namespace) -> str:
    """`message` with its `input[N]` named as the record it is: `FILE:LINE` (or `FILE:ID`), a
    folder's file name (faults IV: "input[812]" of a folder of notes named nothing)."""
    if args.input is None:
        return message

    def named(match: re.Match[str]) -> str:
        n = int(match.group(1))
        if n >= len(records.ids):
            return match.group(0)
        record = records.ids[n]
        where = f"{args.input}:{record}" if args.input.is_file() else f"{args.input}/{record}"
        return f"{where} ({match.group(0)})"

    return re.sub(r"input\[(\d+)\]", named, message, count=1)
