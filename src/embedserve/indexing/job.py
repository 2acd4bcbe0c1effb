"""`embedserve index`: embed a corpus of files into Parquet with Ray Data, resumably.

All the input files of a job (jsonl, json or Parquet; records with an id and a text field) are
read as one Ray Dataset (one per format) with each record's file path, so one actor pool of
`Embedder`s (one per GPU, or one CPU actor that takes every core) works through the whole corpus
with no start-up or drain between files. The Dataset keeps its order, so the driver sees each
file's rows together: it writes them to that file's Parquet under a temporary name and renames
it once the next file begins, with the records that could not be embedded in an errors file
beside it. A manifest (`_index.json`) records every finished input with its size and
modification time as they were before the job read it, and what made its vectors (`identity`);
a second run skips the inputs it lists whose output is still there with the same row count, so a
job killed half-way resumes from the first unfinished file and every record is written exactly
once. A rerun with options that make other vectors is refused, or with `overwrite` re-embeds.

Output columns: `id`, `vector` (list of float32, or of int8 / uint8 for those output dtypes),
`model`, `dims`, `output_dtype`; with `outputs` naming them, the sparse and multi-vector columns
of `retrieval.columns` (beside `vector`, or instead of it when dense is not asked for). A bad record (missing or empty text, a text that is not a
string, an input over the model's limit without `--truncate`) goes to `<name>.errors.jsonl`
with its id and the reason, and does not stop the job unless `fail_fast`.

Ray is an optional dependency (`pip install 'embedserve[ray]'`); `embed_dataset(ds, ...)` is the
entry point for users who already hold a Ray Dataset.

This module is the driver (the order of rows, progress, the run); the embedding actor is in
`indexing.actor`, the inputs, outputs and manifest in `indexing.files`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.indexing.actor import (
    PATH_COLUMN,
    IndexOptions,
    actor_gpus,
    embed_dataset,
    require_ray,
)
from embedserve.indexing.files import (
    INPUT_SUFFIXES,
    OutputFile,
    check_output,
    count_records,
    fingerprint,
    input_files,
    input_key,
    is_done,
    output_names,
    read_inputs,
    read_manifest,
    write_manifest,
)
from embedserve.indexing.identity import drop_stale, vectors_identity

# the public names of `embedserve index` from Python (docs/indexing.md), wherever they live
__all__ = ["IndexOptions", "Job", "Progress", "embed_dataset", "input_files", "run_index"]

PROGRESS_EVERY_S = 15.0


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


def _runs(paths: np.ndarray) -> Iterator[tuple[str, slice]]:
    """(path, rows) for each run of equal paths in a batch, in order."""
    start = 0
    for i in range(1, len(paths) + 1):
        if i == len(paths) or paths[i] != paths[start]:
            yield str(paths[start]), slice(start, i)
            start = i


class Job:
    """The driver's side of a run: rows in order -> one OutputFile at a time -> the manifest."""

    def __init__(
        self,
        out: Path,
        manifest: dict[str, Any],
        names: dict[str, str],
        progress: Any,
        identity: dict[str, Any] | None = None,
        fingerprints: dict[str, dict[str, Any]] | None = None,
    ):
        """`identity`: what made the vectors (`identity.vectors_identity`), listed with each
        input; `fingerprints`: each input's, taken before the job read it."""
        self.out, self.manifest, self.names, self.progress = out, manifest, names, progress
        self.identity = identity
        self.fingerprints = dict(fingerprints or {})
        self.current: tuple[Path, OutputFile] | None = None
        self.finished: set[str] = set()

    def consume(self, paths: list[Path], batches: Iterator[dict[str, np.ndarray]]) -> None:
        by_key = {input_key(p): p for p in paths}
        for key, p in by_key.items():
            # before the first row is read: a record appended while the job reads the file
            # changes it, and the next run embeds the file again
            self.fingerprints.setdefault(key, fingerprint(p))
        for batch in batches:
            for key, rows in _runs(batch[PATH_COLUMN]):
                key = str(Path(key).resolve())
                if key in self.finished or key not in by_key:
                    # the Dataset keeps its order, so a file's rows come together: this would be
                    # a bug, and the file is not listed as done
                    raise RuntimeError(f"embedserve index: rows of {key} arrived out of order")
                if self.current is None or input_key(self.current[0]) != key:
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
            if input_key(p) not in self.finished:
                self.current = (p, OutputFile(self.out, self.names[input_key(p)]))
                self._finish()

    def _finish(self) -> None:
        if self.current is None:
            return
        path, file = self.current
        self.current = None
        file.close()
        self.finished.add(input_key(path))
        self.manifest[input_key(path)] = {
            "input": self.fingerprints[input_key(path)],
            "output": f"{file.stem}.parquet",
            "errors": f"{file.stem}.errors.jsonl",
            "records": file.records,
            "bad_records": file.errors,
            "vectors": self.identity,
        }
        # after the file it lists: a crash leaves it unlisted
        write_manifest(self.out, self.manifest)
        self.progress.file_done()


def start_ray(ray: Any, address: str | None, verbose: bool) -> None:
    """A local Ray for the job, or the cluster at `address`. Unless `verbose`, quiet: Ray's
    own log lines, its workers' output and Ray Data's progress bars are not shown (the job's
    progress lines are; Ray's errors still come back as exceptions)."""
    if ray.is_initialized():
        return
    quiet = {} if verbose else {"RAY_BACKEND_LOG_LEVEL": os.environ.get("RAY_BACKEND_LOG_LEVEL")}
    if not verbose:
        logging.getLogger("ray").setLevel(logging.ERROR)
        # NOTE: the C++ core worker's own lines: an error-level one for every actor with
        # restarts, whose constructor arguments Ray Data puts in the object store
        # (ray-project/ray#53727). Read by the processes ray.init starts, so set while it runs
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=verbose,
            logging_level=logging.INFO if verbose else logging.ERROR,
            ignore_reinit_error=True,
        )
    finally:
        for name, value in quiet.items():  # as it was
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if not verbose:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)


def run_index(
    inputs: str | Path,
    output: str | Path,
    options: IndexOptions,
    *,
    ray_address: str | None = None,
    log: Callable[[str], None] | None = None,
    overwrite: bool = False,
    verbose: bool = False,
) -> dict[str, Any]:
    """The job (see the module docstring); returns its summary (files done / skipped, records,
    errors, tokens, seconds). An output folder whose vectors were made with other options
    (`identity`) is refused, or with `overwrite` its outputs that differ are made again."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    # NOTE: one file named twice (a symlink to another input, overlapping globs) is one input
    files = list({input_key(p): p for p in input_files(inputs)}.values())
    out = Path(output)
    check_output(out, files)
    if PATH_COLUMN in (options.id_field, options.text_field):
        raise ValueError(f"--id-field / --text-field: {PATH_COLUMN!r} is the column of file paths")
    ray = require_ray()
    if ray_address:  # the cluster's GPUs decide the dtype
        start_ray(ray, ray_address, verbose)
    identity = vectors_identity(options, actor_gpus(ray, options))
    out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out)
    removed = drop_stale(out, manifest, identity, overwrite)
    if removed:
        log(f"embedserve index: --overwrite: {removed} outputs made with other options removed")
    names = output_names(files, manifest)
    todo = [p for p in files if not is_done(out, manifest.get(input_key(p), {}), p)]
    # before the Datasets read them (see `Job.consume`)
    fingerprints = {input_key(p): fingerprint(p) for p in todo}
    skipped = len(files) - len(todo)
    if skipped:
        log(f"embedserve index: {skipped} of {len(files)} files already done, skipped")
    counts = [count_records(p, options.lines) for p in todo]
    total = None if None in counts else sum(c or 0 for c in counts)
    progress = Progress(len(files), skipped, total, log)
    if todo:
        start_ray(ray, ray_address, verbose)
        # rows come out in input order, so each file is complete when the next one begins
        ray.data.DataContext.get_current().execution_options.preserve_order = True
    job = Job(out, manifest, names, progress, identity, fingerprints)
    for suffix in INPUT_SUFFIXES:  # one Dataset, one actor pool, per format
        group = [p for p in todo if p.suffix == suffix]
        if group:
            ds = embed_dataset(read_inputs(ray, group, options.lines), options)
            job.consume(group, ds.iter_batches(batch_format="numpy", batch_size=None))
    return {
        "files": len(files),
        "skipped": skipped,
        "records": progress.records,
        "errors": progress.errors,
        "tokens": progress.tokens,
        "seconds": round(time.perf_counter() - progress.started, 2),
    }
