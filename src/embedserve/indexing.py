"""`embedserve index`: embed a corpus of files into Parquet with Ray Data, resumably.

Each input file (jsonl or Parquet, records with an id and a text field) is one unit of work:
Ray Data reads it, `map_batches` embeds its records on an actor pool of `Embedder`s (one per
GPU, or CPU workers that share the cores), and the driver writes its vectors to one Parquet file
in the output folder, atomically (a temporary name, then a rename), with the records that could
not be embedded in an errors file beside it. A manifest (`_index.json`) records every finished
input with its size and modification time; a second run skips the inputs it lists whose output
is still there with the same row count, so a job killed half-way resumes where it stopped and
every record is written exactly once.

Output columns: `id`, `vector` (list of float32, or of int8 / uint8 for those output dtypes),
`model`, `dims`, `output_dtype`. A bad record (missing or empty text, a text that is not a
string, an input over the model's limit without `--truncate`) goes to `<stem>.errors.jsonl`
with its id and the reason, and does not stop the job unless `fail_fast`.

Ray is an optional dependency (`pip install 'embedserve[ray]'`); `embed_dataset(ds, ...)` is the
entry point for users who already hold a Ray Dataset.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.errors import InputError, InputTooLong

MANIFEST = "_index.json"
INPUT_SUFFIXES = (".jsonl", ".json", ".parquet")
RAY_INSTALL = "embedserve index needs Ray Data: pip install 'embedserve[ray]'"


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
    extra: dict[str, Any] = field(default_factory=dict)


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
        # the width and dtype of a row as the output dtype makes it (binary packs 8 per byte);
        # also warms the engine up
        probe = self._encode(["warm-up"])
        self.width, self.dtype = probe.shape[1], probe.dtype

    def _encode(self, texts: list[str]) -> np.ndarray:
        o = self.options
        return self.embedder.encode(
            texts,
            prompt_name=o.prompt_name,
            input_type=o.input_type,
            truncate=o.truncate,
            output_dtype=o.output_dtype,
        )

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
        if good:
            chosen = [str(texts[i]) for i in good]  # type: ignore[index]
            try:
                vectors[good] = self._encode(chosen)
            except InputError:  # find which records, one by one: the rest still embed
                for i in good:
                    try:
                        vectors[i] = self._encode([str(texts[i])])[0]  # type: ignore[index]
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
        width = self.embedder.dimensions
        return {
            "id": np.array(ids, dtype=object),
            "vector": vectors,
            "error": np.array([r or "" for r in reasons], dtype=object),
            "model": np.array([self.model_name] * n, dtype=object),
            "dims": np.full(n, width, dtype=np.int32),
            "output_dtype": np.array([o.output_dtype] * n, dtype=object),
        }


def _read(ray: Any, path: Path) -> Any:
    if path.suffix == ".parquet":
        return ray.data.read_parquet(str(path))
    return ray.data.read_json(str(path), lines=path.suffix == ".jsonl")


def _gpus() -> int:
    from embedserve.launch import visible_gpus

    return visible_gpus()


def embed_dataset(ds: Any, options: IndexOptions) -> Any:
    """A Ray Dataset of records -> a Dataset with `id`, `vector`, `error`, `model`, `dims`,
    `output_dtype` (`error` non-empty where the record could not be embedded), embedded on an
    actor pool: one actor per GPU (each owning one), else `options.workers` CPU actors."""
    gpus = _gpus() if options.device in ("auto", "cuda") else 0
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


@dataclass
class Progress:
    total_files: int
    records: int = 0
    errors: int = 0
    tokens_hint: int = 0
    started: float = field(default_factory=time.perf_counter)

    def line(self, done_files: int) -> str:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        rate = self.records / elapsed
        left = self.total_files - done_files
        eta = f", ETA {elapsed / max(done_files, 1) * left:.0f} s" if done_files else ""
        return (
            f"embedserve index: {done_files}/{self.total_files} files, {self.records} records "
            f"({rate:.0f}/s), {self.errors} errors{eta}"
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


def _output_name(path: Path, files: Sequence[Path]) -> str:
    """The output stem of an input: its name, made unique among the job's inputs."""
    stems = [p.stem for p in files]
    if stems.count(path.stem) == 1:
        return path.stem
    return f"{path.stem}-{files.index(path):05d}"


def _done(out: Path, key: str, entry: dict[str, Any], path: Path) -> bool:
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


def _write_file(out: Path, stem: str, batches: Iterator[dict[str, np.ndarray]]) -> tuple[int, int]:
    """The vectors of one input into `<stem>.parquet` and its bad records into
    `<stem>.errors.jsonl`, each written under a temporary name and renamed when complete."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = out / f".{stem}.parquet.tmp"
    err_tmp = out / f".{stem}.errors.jsonl.tmp"
    writer: Any = None
    records = errors = 0
    vector_type: Any = None  # the fixed-size list type of this file's rows
    with err_tmp.open("w", encoding="utf-8") as err_file:
        for batch in batches:
            rows = np.asarray(batch["vector"])
            if vector_type is None and rows.ndim == 2:  # known even when no row is good
                vector_type = pa.list_(_arrow_type(rows), rows.shape[1])
            keep = np.array([not e for e in batch["error"]], dtype=bool)
            for i in np.flatnonzero(~keep):
                err_file.write(
                    json.dumps({"id": batch["id"][i], "error": batch["error"][i]}) + "\n"
                )
                errors += 1
            if not keep.any():
                continue
            vectors = np.asarray(batch["vector"])[keep]
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
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
            records += table.num_rows
    if writer is None:  # no good record: an empty file with the same schema as the others
        schema = pa.schema(
            [
                ("id", pa.string()),
                ("vector", vector_type or pa.list_(pa.float32())),
                ("model", pa.string()),
                ("dims", pa.int32()),
                ("output_dtype", pa.string()),
            ]
        )
        writer = pq.ParquetWriter(tmp, schema)
    writer.close()
    os.replace(tmp, out / f"{stem}.parquet")
    os.replace(err_tmp, out / f"{stem}.errors.jsonl")
    return records, errors


def _arrow_type(v: np.ndarray) -> Any:
    import pyarrow as pa

    return {np.dtype(np.int8): pa.int8(), np.dtype(np.uint8): pa.uint8()}.get(v.dtype, pa.float32())


def run_index(
    inputs: str | Path,
    output: str | Path,
    options: IndexOptions,
    *,
    ray_address: str | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """The job (see the module docstring); returns its summary (files done / skipped, records,
    errors, seconds)."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    files = input_files(inputs)
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    ray = require_ray()
    manifest = _manifest(out)
    todo = [
        p for p in files if not _done(out, str(p.resolve()), manifest.get(str(p.resolve()), {}), p)
    ]
    skipped = len(files) - len(todo)
    if skipped:
        log(f"embedserve index: {skipped} of {len(files)} files already done, skipped")
    progress = Progress(len(files))
    if todo and not ray.is_initialized():
        ray.init(
            address=ray_address,
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
        )
    for n, path in enumerate(todo, 1):
        stem = _output_name(path, files)
        ds = embed_dataset(_read(ray, path), options)
        records, errors = _write_file(
            out, stem, ds.iter_batches(batch_format="numpy", batch_size=None)
        )
        progress.records += records
        progress.errors += errors
        manifest[str(path.resolve())] = {
            "input": _fingerprint(path),
            "output": f"{stem}.parquet",
            "errors": f"{stem}.errors.jsonl",
            "records": records,
            "bad_records": errors,
        }
        tmp = out / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, out / MANIFEST)  # after the file it lists: a crash leaves it unlisted
        log(progress.line(skipped + n))
    return {
        "files": len(files),
        "skipped": skipped,
        "records": progress.records,
        "errors": progress.errors,
        "seconds": round(time.perf_counter() - progress.started, 2),
    }
