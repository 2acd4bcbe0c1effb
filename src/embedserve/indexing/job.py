"""`embedserve index`: embed a corpus of files into Parquet with Ray Data, resumably.

All the input files of a job (jsonl, json or Parquet; records with an id and a text field) are
read as one Ray Dataset (one per format) with each record's file path, so one actor pool of
`Embedder`s (one per GPU, or one CPU actor that takes every core) works through the whole corpus
with no start-up or drain between files. The Dataset keeps its order, so the driver sees each
file's rows together: it writes them to that file's Parquet under a temporary name and renames
it once the next file begins, with the records that could not be embedded in an errors file
beside it. A manifest (`_index.json`) records every finished input with its size and
modification time; a second run skips the inputs it lists whose output is still there with the
same row count, so a job killed half-way resumes from the first unfinished file and every record
is written exactly once.

Output columns: `id`, `vector` (list of float32, or of int8 / uint8 for those output dtypes),
`model`, `dims`, `output_dtype`. A bad record (missing or empty text, a text that is not a
string, an input over the model's limit without `--truncate`) goes to `<name>.errors.jsonl`
with its id and the reason, and does not stop the job unless `fail_fast`.

Ray is an optional dependency (`pip install 'embedserve[ray]'`); `embed_dataset(ds, ...)` is the
entry point for users who already hold a Ray Dataset.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.errors import InputError, InputTooLong

MANIFEST = "_index.json"
INPUT_SUFFIXES = (".jsonl", ".json", ".parquet")
RAY_INSTALL = "embedserve index needs Ray Data: pip install 'embedserve[ray]'"
PATH_COLUMN = "path"  # the column Ray Data's include_paths adds: each record's input file
PROGRESS_EVERY_S = 15.0
COUNT_SAMPLE_BYTES = 1 << 20  # a jsonl file's lines are counted in this much of it, for the ETA


@dataclass(frozen=True)
class IndexOptions:
    """What every record of the job is embedded with (the `Embedder.encode` options)."""

    model: str = "minilm"
    id_field: str = "id"
    text_field: str = "text"
    prompt_name: str | None = None
    input_type: str | None = None
    truncate: Any = False
    output_dtype: str = "float32"
    device: str = "auto"
    batch_size: int = 256  # records per map_batches call
    workers: int | None = None  # actors; None: one per GPU, else one on the CPU
    fail_fast: bool = False


def require_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise ValueError(RAY_INSTALL) from None
    return ray


def input_files(spec: str | Path) -> list[Path]:
    """A file, a folder (its jsonl / json / Parquet files) or a glob, sorted; an error if none."""
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
            f"--input {text}: no input files (expected .jsonl, .json or .parquet, a folder of "
            "them, or a glob)"
        )
    bad = [p for p in files if p.suffix not in INPUT_SUFFIXES]
    if bad:
        raise ValueError(f"--input {bad[0]}: expected a .jsonl, .json or .parquet file")
    return files


def _id_text(value: Any) -> str:
    """A record's id as text; "" when missing. NOTE: an integer id column with a gap arrives as
    float64 with NaN (Arrow to NumPy): 3.0 is the id 3, NaN a missing id."""
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        if np.isnan(value):
            return ""
        if float(value).is_integer():
            return str(int(value))
    return str(value)


class EmbedBatch:
    """The actor `map_batches` runs: one Embedder, records in, vectors and errors out."""

    def __init__(self, options: IndexOptions, cpu_threads: int = 0) -> None:
        from embedserve.embedder import Embedder

        if cpu_threads:
            # NOTE: Ray sets OMP_NUM_THREADS to the actor's logical CPUs (1, so that the readers
            # get the others); the model's threads are the share of the cores asked for here
            import torch

            torch.set_num_threads(cpu_threads)
        self.options = options
        self.embedder = Embedder(options.model, device=options.device)
        self.model_name = str(options.model)
        o = options
        self.input_options = self.embedder.inputs.options(
            prompt_name=o.prompt_name, input_type=o.input_type, truncate=o.truncate
        )
        self.head = self.embedder.inputs.head(None, True, o.output_dtype)
        # the width and dtype of a row as the output dtype makes it (binary packs 8 per byte);
        # also warms the engine up
        probe, _ = self._encode(["warm-up"])
        self.width, self.dtype = probe.shape[1], probe.dtype

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        """`Embedder.encode`'s steps, keeping each text's token count (for tokens/s)."""
        prepared = self.embedder.inputs.prepare(texts, self.input_options)
        e = self.embedder
        pooled = e.embed_ids(prepared.seqs, batch_tokens=e.engine.batch_tokens)
        lengths = [len(s) for s in prepared.seqs]
        if prepared.windows_per_input is not None:  # chunked: a text's windows together
            windows = prepared.windows_per_input
            ends = np.cumsum(windows)
            lengths = [sum(lengths[b - n : b]) for b, n in zip(ends, windows, strict=True)]
        return self.head.apply(prepared.combine(pooled)), lengths

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        o = self.options
        n = len(next(iter(batch.values()))) if batch else 0
        ids = [_id_text(v) for v in batch[o.id_field]] if o.id_field in batch else [""] * n
        texts = batch.get(o.text_field)
        reasons: list[str | None] = [None] * n
        for i in range(n):
            if not ids[i]:
                reasons[i] = f"missing {o.id_field!r}"
            value = None if texts is None else texts[i]
            if value is None or (isinstance(value, float) and np.isnan(value)):
                reasons[i] = reasons[i] or f"missing {o.text_field!r}"
            elif not isinstance(value, str):
                reasons[i] = (
                    reasons[i] or f"{o.text_field!r} is {type(value).__name__}, not a string"
                )
            elif not value.strip():
                reasons[i] = reasons[i] or f"{o.text_field!r} is empty"
        good = [i for i in range(n) if reasons[i] is None]
        vectors = np.zeros((n, self.width), dtype=self.dtype)  # a bad record's row stays zero
        tokens = np.zeros(n, dtype=np.int64)
        if good:
            chosen = [str(texts[i]) for i in good]  # type: ignore[index]
            try:
                vectors[good], tokens[good] = self._encode(chosen)
            except InputError:  # find which records, one by one: the rest still embed
                for i in good:
                    try:
                        row, count = self._encode([str(texts[i])])  # type: ignore[index]
                        vectors[i], tokens[i] = row[0], count[0]
                    except InputTooLong as e:  # the advice in `embedserve index` terms
                        reasons[i] = (
                            f"the text has {e.num_tokens} tokens, over this model's limit of "
                            f"{e.max_length}; shorten it or pass --truncate end / start"
                        )
                    except InputError as e:
                        reasons[i] = str(e).replace("input[0]", "the text")
        if o.fail_fast and any(reasons):
            k = next(i for i in range(n) if reasons[i])
            raise ValueError(f"record {ids[k]!r}: {reasons[k]}")
        out = {
            "id": np.array(ids, dtype=object),
            "vector": vectors,
            "error": np.array([r or "" for r in reasons], dtype=object),
            "model": np.array([self.model_name] * n, dtype=object),
            "dims": np.full(n, self.embedder.dimensions, dtype=np.int32),
            "output_dtype": np.array([o.output_dtype] * n, dtype=object),
            "tokens": tokens,
        }
        if PATH_COLUMN in batch:
            out[PATH_COLUMN] = batch[PATH_COLUMN]
        return out


def _cluster_gpus(ray: Any) -> int:
    """GPUs of the Ray cluster the job runs on (every node's, not only this machine's)."""
    if ray.is_initialized():
        return int(ray.cluster_resources().get("GPU", 0))
    from embedserve.cli.launch import visible_gpus

    return visible_gpus()


def embed_dataset(ds: Any, options: IndexOptions | None = None, **fields: Any) -> Any:
    """A Ray Dataset of records -> a Dataset with `id`, `vector`, `error`, `model`, `dims`,
    `output_dtype`, `tokens` (`error` non-empty where the record could not be embedded),
    embedded on an actor pool: one actor per GPU of the cluster (each owning one), else
    `options.workers` CPU actors. Options as an `IndexOptions` or as its fields
    (`embed_dataset(ds, model="minilm", input_type="document")`)."""
    options = replace(options or IndexOptions(), **fields)
    ray = require_ray()
    gpus = _cluster_gpus(ray) if options.device in ("auto", "cuda") else 0
    workers = options.workers or max(gpus, 1)
    # an actor that dies (a killed worker) is restarted and its batches retried: each record
    # still comes out once
    remote: dict[str, Any] = {"max_restarts": -1, "max_task_retries": -1}
    threads = 0 if gpus else max(1, (os.cpu_count() or 1) // workers)
    return ds.map_batches(
        EmbedBatch,
        fn_constructor_args=(options, threads),
        batch_size=options.batch_size,
        batch_format="numpy",
        concurrency=workers,
        num_gpus=1 if gpus else 0,
        num_cpus=1,
        **remote,
    )


def _count_records(path: Path) -> int | None:
    """Records in an input, for the ETA: exact for Parquet (its footer) and small jsonl files,
    estimated from the first MiB of a larger one (so a corpus is not read twice); None for a
    .json file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return int(pq.ParquetFile(path).metadata.num_rows)
        except Exception:  # unreadable here: Ray's reader says why
            return None
    if path.suffix != ".jsonl":
        return None
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(min(size, COUNT_SAMPLE_BYTES))
    lines = head.count(b"\n") + (1 if head and not head.endswith(b"\n") else 0)
    if size <= COUNT_SAMPLE_BYTES or not lines:
        return lines
    return round(lines * size / len(head))


@dataclass
class Progress:
    """One line on stderr each time a file is done and every PROGRESS_EVERY_S seconds."""

    total_files: int
    done_files: int
    total_records: int | None
    log: Callable[[str], None]
    records: int = 0
    errors: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.perf_counter)
    last: float = field(default_factory=time.perf_counter)

    def add(self, records: int, errors: int, tokens: int) -> None:
        self.records += records
        self.errors += errors
        self.tokens += tokens
        if time.perf_counter() - self.last >= PROGRESS_EVERY_S:
            self.show()

    def file_done(self) -> None:
        self.done_files += 1
        self.show()

    def show(self) -> None:
        now = time.perf_counter()
        self.last = now
        elapsed = max(now - self.started, 1e-9)
        seen = self.records + self.errors
        rate = seen / elapsed
        of = f"/{self.total_records}" if self.total_records else ""
        eta = ""
        if self.total_records and rate > 0:
            eta = f", ETA {max(self.total_records - seen, 0) / rate:.0f} s"
        self.log(
            f"embedserve index: {self.done_files}/{self.total_files} files, {seen}{of} records "
            f"({rate:.0f}/s, {self.tokens / elapsed:.0f} tokens/s), {self.errors} errors{eta}"
        )


def _manifest(out: Path) -> dict[str, Any]:
    path = out / MANIFEST
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _fingerprint(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _key(path: Path) -> str:
    return str(path.resolve())


def output_names(files: Sequence[Path], manifest: dict[str, Any]) -> dict[str, str]:
    """Each input's output stem: the one the manifest lists for it (so a rewrite replaces its
    file); else its own stem when no other input of this job, nor one an earlier job wrote to the
    same folder, has it; else the stem and a hash of its full path."""
    taken = {e.get("output", "")[: -len(".parquet")]: k for k, e in manifest.items()}
    stems = [p.stem for p in files]
    names = {}
    for p in files:
        key = _key(p)
        listed = manifest.get(key, {}).get("output", "")
        owner = taken.get(p.stem)
        if listed.endswith(".parquet"):
            names[key] = listed[: -len(".parquet")]
        elif stems.count(p.stem) == 1 and owner in (None, key):
            names[key] = p.stem
        else:
            names[key] = f"{p.stem}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"
    return names


def _check_output(out: Path, files: Sequence[Path]) -> None:
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


def _done(out: Path, entry: dict[str, Any], path: Path) -> bool:
    """Listed in the manifest for this very input, and its output still complete."""
    if entry.get("input") != _fingerprint(path):
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
        self.vector_type: Any = None  # the fixed-size list type of this file's rows
        self.records = self.errors = 0

    def write(self, batch: dict[str, np.ndarray]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = np.asarray(batch["vector"])
        if self.vector_type is None and rows.ndim == 2:  # known even when no row is good
            self.vector_type = pa.list_(_arrow_type(rows), rows.shape[1])
        keep = np.array([not e for e in batch["error"]], dtype=bool)
        for i in np.flatnonzero(~keep):
            line = json.dumps({"id": batch["id"][i], "error": batch["error"][i]})
            self.err_file.write(line + "\n")
            self.errors += 1
        if not keep.any():
            return
        vectors = rows[keep]
        flat = pa.array(vectors.reshape(-1), _arrow_type(vectors))
        table = pa.table(
            {
                "id": pa.array(list(batch["id"][keep]), pa.string()),
                "vector": pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1]),
                "model": pa.array(list(batch["model"][keep]), pa.string()),
                "dims": pa.array(batch["dims"][keep], pa.int32()),
                "output_dtype": pa.array(list(batch["output_dtype"][keep]), pa.string()),
            }
        )
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.tmp, table.schema)
        self.writer.write_table(table)
        self.records += table.num_rows

    def close(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.err_file.close()
        if self.writer is None:  # no good record: an empty file with the same schema as others
            schema = pa.schema(
                [
                    ("id", pa.string()),
                    ("vector", self.vector_type or pa.list_(pa.float32())),
                    ("model", pa.string()),
                    ("dims", pa.int32()),
                    ("output_dtype", pa.string()),
                ]
            )
            self.writer = pq.ParquetWriter(self.tmp, schema)
        self.writer.close()
        os.replace(self.tmp, self.out / f"{self.stem}.parquet")
        os.replace(self.err_tmp, self.out / f"{self.stem}.errors.jsonl")


def _arrow_type(v: np.ndarray) -> Any:
    import pyarrow as pa

    return {np.dtype(np.int8): pa.int8(), np.dtype(np.uint8): pa.uint8()}.get(v.dtype, pa.float32())


def _read(ray: Any, paths: list[Path]) -> Any:
    """One Dataset over inputs of one format, each record with its file's path."""
    names = [str(p.resolve()) for p in paths]
    if paths[0].suffix == ".parquet":
        return ray.data.read_parquet(names, include_paths=True)
    return ray.data.read_json(names, lines=paths[0].suffix == ".jsonl", include_paths=True)


def _runs(paths: np.ndarray) -> Iterator[tuple[str, slice]]:
    """(path, rows) for each run of equal paths in a batch, in order."""
    start = 0
    for i in range(1, len(paths) + 1):
        if i == len(paths) or paths[i] != paths[start]:
            yield str(paths[start]), slice(start, i)
            start = i


class Job:
    """The driver's side of a run: rows in order -> one OutputFile at a time -> the manifest."""

    def __init__(self, out: Path, manifest: dict[str, Any], names: dict[str, str], progress: Any):
        self.out, self.manifest, self.names, self.progress = out, manifest, names, progress
        self.current: tuple[Path, OutputFile] | None = None
        self.finished: set[str] = set()

    def consume(self, paths: list[Path], batches: Iterator[dict[str, np.ndarray]]) -> None:
        by_key = {_key(p): p for p in paths}
        for batch in batches:
            for key, rows in _runs(batch[PATH_COLUMN]):
                key = str(Path(key).resolve())
                if key in self.finished or key not in by_key:
                    # the Dataset keeps its order, so a file's rows come together: this would be
                    # a bug, and the file is not listed as done
                    raise RuntimeError(f"embedserve index: rows of {key} arrived out of order")
                if self.current is None or _key(self.current[0]) != key:
                    self._finish()
                    self.current = (by_key[key], OutputFile(self.out, self.names[key]))
                part = {k: v[rows] for k, v in batch.items()}
                self.current[1].write(part)
                self.progress.add(
                    int(sum(1 for e in part["error"] if not e)),
                    int(sum(1 for e in part["error"] if e)),
                    int(part["tokens"].sum()),
                )
        self._finish()
        for p in paths:  # an input with no record at all: an empty output
            if _key(p) not in self.finished:
                self.current = (p, OutputFile(self.out, self.names[_key(p)]))
                self._finish()

    def _finish(self) -> None:
        if self.current is None:
            return
        path, file = self.current
        self.current = None
        file.close()
        self.finished.add(_key(path))
        self.manifest[_key(path)] = {
            "input": _fingerprint(path),
            "output": f"{file.stem}.parquet",
            "errors": f"{file.stem}.errors.jsonl",
            "records": file.records,
            "bad_records": file.errors,
        }
        tmp = self.out / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=1))
        os.replace(tmp, self.out / MANIFEST)  # after the file it lists: a crash leaves it unlisted
        self.progress.file_done()


def run_index(
    inputs: str | Path,
    output: str | Path,
    options: IndexOptions,
    *,
    ray_address: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The job (see the module docstring); returns its summary (files done / skipped, records,
    errors, tokens, seconds)."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    # NOTE: one file named twice (a symlink to another input, overlapping globs) is one input
    files = list({_key(p): p for p in input_files(inputs)}.values())
    out = Path(output)
    _check_output(out, files)
    if PATH_COLUMN in (options.id_field, options.text_field):
        raise ValueError(f"--id-field / --text-field: {PATH_COLUMN!r} is the column of file paths")
    out.mkdir(parents=True, exist_ok=True)
    ray = require_ray()
    manifest = _manifest(out)
    names = output_names(files, manifest)
    todo = [p for p in files if not _done(out, manifest.get(_key(p), {}), p)]
    skipped = len(files) - len(todo)
    if skipped:
        log(f"embedserve index: {skipped} of {len(files)} files already done, skipped")
    counts = [_count_records(p) for p in todo]
    total = None if None in counts else sum(c or 0 for c in counts)
    progress = Progress(len(files), skipped, total, log)
    if todo and not ray.is_initialized():
        ray.init(
            address=ray_address,
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
        )
    if todo:
        # rows come out in input order, so each file is complete when the next one begins
        ray.data.DataContext.get_current().execution_options.preserve_order = True
    job = Job(out, manifest, names, progress)
    for suffix in INPUT_SUFFIXES:  # one Dataset, one actor pool, per format
        group = [p for p in todo if p.suffix == suffix]
        if group:
            ds = embed_dataset(_read(ray, group), options)
            job.consume(group, ds.iter_batches(batch_format="numpy", batch_size=None))
    return {
        "files": len(files),
        "skipped": skipped,
        "records": progress.records,
        "errors": progress.errors,
        "tokens": progress.tokens,
        "seconds": round(time.perf_counter() - progress.started, 2),
    }
