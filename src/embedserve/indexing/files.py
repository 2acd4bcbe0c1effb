"""The files of `embedserve index`: finding the inputs and reading them as a Ray Dataset, naming
and writing each input's outputs (atomically), and the manifest that makes a job resumable."""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "_index.json"
# text files: each one document (its id the file's name), or with `lines` one record per line
TEXT_SUFFIXES = (".txt", ".md")
INPUT_SUFFIXES = (".jsonl", ".json", ".parquet", *TEXT_SUFFIXES)
COUNT_SAMPLE_BYTES = 1 << 20  # a jsonl file's lines are counted in this much of it, for the ETA


def input_files(spec: str | Path) -> list[Path]:
    """A file, a folder (its jsonl / json / Parquet / .txt / .md files) or a glob, sorted; an
    error if none."""
    text = str(spec)
    path = Path(text).expanduser()
    if path.is_dir():
        files = [p for p in sorted(path.iterdir()) if p.suffix in INPUT_SUFFIXES]
    elif path.is_file():
        files = [path]
    else:
        files = [Path(p) for p in sorted(glob.glob(text)) if Path(p).suffix in INPUT_SUFFIXES]
    if not files:
        raise ValueError(
            f"--input {text}: no input files (expected .jsonl, .json, .parquet, .txt or .md, a "
            "folder of them, or a glob)"
        )
    bad = [p for p in files if p.suffix not in INPUT_SUFFIXES]
    if bad:
        raise ValueError(f"--input {bad[0]}: expected a .jsonl, .json, .parquet, .txt or .md file")
    return files


def count_records(path: Path, lines: bool = False) -> int | None:
    """Records in an input, for the ETA: exact for Parquet (its footer), a text document (one)
    and small jsonl (or text `lines`) files, estimated from the first MiB of a larger one (so a
    corpus is not read twice); None for a .json file."""
    if path.suffix in TEXT_SUFFIXES and not lines:
        return 1
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return int(pq.ParquetFile(path).metadata.num_rows)
        except Exception:  # unreadable here: Ray's reader says why
            return None
    if path.suffix not in (".jsonl", *TEXT_SUFFIXES):
        return None
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(min(size, COUNT_SAMPLE_BYTES))
    count = head.count(b"\n") + (1 if head and not head.endswith(b"\n") else 0)
    if size <= COUNT_SAMPLE_BYTES or not count:
        return count
    return round(count * size / len(head))


def read_manifest(out: Path) -> dict[str, Any]:
    path = out / MANIFEST
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Atomically: a crash leaves the old manifest or the new one."""
    tmp = out / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / MANIFEST)


def fingerprint(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def input_key(path: Path) -> str:
    return str(path.resolve())


def output_names(files: Sequence[Path], manifest: dict[str, Any]) -> dict[str, str]:
    """Each input's output stem: the one the manifest lists for it (so a rewrite replaces its
    file); else its own stem when no other input of this job, nor one an earlier job wrote to the
    same folder, has it; else the stem and a hash of its full path."""
    taken = {e.get("output", "")[: -len(".parquet")]: k for k, e in manifest.items()}
    stems = [p.stem for p in files]
    names = {}
    for p in files:
        key = input_key(p)
        listed = manifest.get(key, {}).get("output", "")
        owner = taken.get(p.stem)
        if listed.endswith(".parquet"):
            names[key] = listed[: -len(".parquet")]
        elif stems.count(p.stem) == 1 and owner in (None, key):
            names[key] = p.stem
        else:
            names[key] = f"{p.stem}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"
    return names


def check_output(out: Path, files: Sequence[Path]) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output {out}: exists and is not a folder")
    folder = out.resolve()
    inside = [p for p in files if p.resolve().parent == folder]
    if inside:
        # its outputs would be inputs of the next run, and could overwrite an input of the same
        # name
        raise ValueError(
            f"--output {out}: is the folder of the input {inside[0]}; write to another folder"
        )


def is_done(out: Path, entry: dict[str, Any], path: Path) -> bool:
    """Listed in the manifest for this very input, and its output still complete."""
    if entry.get("input") != fingerprint(path):
        return False
    target = out / entry.get("output", "")
    if not target.is_file():
        return False
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(target).metadata.num_rows) == int(entry.get("records", -1))
    except Exception:  # unreadable: not complete
        return False


class OutputFile:
    """One input's vectors into `<stem>.parquet` and its bad records into `<stem>.errors.jsonl`,
    each written under a temporary name and renamed by `close` (so complete or absent)."""

    def __init__(self, out: Path, stem: str) -> None:
        self.out, self.stem = out, stem
        self.tmp = out / f".{stem}.parquet.tmp"
        self.err_tmp = out / f".{stem}.errors.jsonl.tmp"
        self.err_file = self.err_tmp.open("w", encoding="utf-8")
        self.writer: Any = None
        self.schema: Any = None  # this file's columns, known from a batch even with no good row
        self.records = self.errors = 0

    def write(self, batch: dict[str, np.ndarray]) -> None:
        import pyarrow.parquet as pq

        keep = np.array([not e for e in batch["error"]], dtype=bool)
        for i in np.flatnonzero(~keep):
            line = json.dumps({"id": batch["id"][i], "error": batch["error"][i]})
            self.err_file.write(line + "\n")
            self.errors += 1
        table = _table(batch, keep)
        self.schema = self.schema or table.schema
        if not keep.any():
            return
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.tmp, table.schema)
        self.writer.write_table(table)
        self.records += table.num_rows

    def close(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.err_file.close()
        if self.writer is None:  # no good record: an empty file with the same schema as others
            schema = self.schema or pa.schema(
                [
                    ("id", pa.string()),
                    ("vector", pa.list_(pa.float32())),
                    ("model", pa.string()),
                    ("dims", pa.int32()),
                    ("output_dtype", pa.string()),
                ]
            )
            self.writer = pq.ParquetWriter(self.tmp, schema)
        self.writer.close()
        os.replace(self.tmp, self.out / f"{self.stem}.parquet")
        os.replace(self.err_tmp, self.out / f"{self.stem}.errors.jsonl")


def _table(batch: dict[str, np.ndarray], keep: np.ndarray) -> Any:
    """The rows of `batch` to keep as Arrow: `id`, `vector` (when dense), the sparse and
    multi-vector columns asked for (`retrieval.columns`), `model`, `dims`, `output_dtype`."""
    import pyarrow as pa

    from embedserve.retrieval.columns import MULTIVECTOR, SPARSE_INDICES, SPARSE_VALUES, columns

    table: dict[str, Any] = {"id": pa.array(list(batch["id"][keep]), pa.string())}
    if "vector" in batch:
        rows = np.asarray(batch["vector"])
        vectors = rows[keep].reshape(-1, rows.shape[1])
        flat = pa.array(vectors.reshape(-1), _arrow_type(vectors))
        table["vector"] = pa.FixedSizeListArray.from_arrays(flat, rows.shape[1])

    def kept(name: str) -> list[Any] | None:
        # NOTE: Ray hands a column of equal-shaped rows back as one array, else as objects
        return (
            None if name not in batch else [r for r, k in zip(batch[name], keep, strict=True) if k]
        )

    dims = int(np.asarray(batch[MULTIVECTOR][0]).shape[-1]) if MULTIVECTOR in batch else 0
    table |= columns(
        dims,
        sparse_indices=kept(SPARSE_INDICES),
        sparse_values=kept(SPARSE_VALUES),
        multivector=kept(MULTIVECTOR),
    )
    table["model"] = pa.array(list(batch["model"][keep]), pa.string())
    table["dims"] = pa.array(batch["dims"][keep], pa.int32())
    table["output_dtype"] = pa.array(list(batch["output_dtype"][keep]), pa.string())
    return pa.table(table)


def _arrow_type(v: np.ndarray) -> Any:
    import pyarrow as pa

    return {np.dtype(np.int8): pa.int8(), np.dtype(np.uint8): pa.uint8()}.get(v.dtype, pa.float32())


def read_inputs(ray: Any, paths: list[Path], lines: bool = False) -> Any:
    """One Dataset over inputs of one format, each record with its file's path; a text file is
    one document (`text`, its `id` the file's name), or with `lines` a record per line."""
    names = [str(p.resolve()) for p in paths]
    if paths[0].suffix == ".parquet":
        return ray.data.read_parquet(names, include_paths=True)
    if paths[0].suffix in TEXT_SUFFIXES:
        files = ray.data.read_binary_files(names, include_paths=True)
        return files.map_batches(text_lines if lines else text_documents, batch_format="numpy")
    return ray.data.read_json(names, lines=paths[0].suffix == ".jsonl", include_paths=True)


def _decoded(data: Any) -> str | None:
    try:
        return bytes(data).decode("utf-8-sig")  # an editor's byte-order mark is not text
    except UnicodeDecodeError:
        return None


def split_lines(text: str) -> list[str]:
    """A text file's lines: split at "\n" alone, a "\r" before it dropped. NOTE: not
    `str.splitlines`, which also splits at U+2028, U+0085, form feeds and more: a file of 4 lines
    gave 7 texts and every later `FILE:LINE` id shifted, and a JSON line holding a raw U+2028 (valid
    JSON) was cut in two."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def text_documents(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Text files read whole (`bytes`, `path`) as records: `text` (UTF-8; a file that is not is
    a bad record, its text missing), `id` (the file's name), `path`."""
    return {
        "text": np.array([_decoded(d) for d in batch["bytes"]], dtype=object),
        "id": np.array([Path(str(p)).name for p in batch["path"]], dtype=object),
        "path": batch["path"],
    }


def text_lines(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Text files read whole as a record per line: `text`, `id` (`NAME:LINE`, from 1), `path`."""
    texts: list[str | None] = []
    ids: list[str] = []
    paths: list[Any] = []
    for data, path in zip(batch["bytes"], batch["path"], strict=True):
        text = _decoded(data)
        rows: list[str | None] = [None] if text is None else list(split_lines(text))
        texts += rows
        ids += [f"{Path(str(path)).name}:{n}" for n in range(1, len(rows) + 1)]
        paths += [path] * len(rows)
    return {
        "text": np.array(texts, dtype=object),
        "id": np.array(ids, dtype=object),
        "path": np.array(paths, dtype=object),
    }
