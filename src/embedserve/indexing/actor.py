"""The embedding side of `embedserve index`: the actor Ray Data runs on each batch of records
(one `Embedder`: records in, vectors and per-record errors out), and the actor pool over a Ray
Dataset (`embed_dataset`, also the entry point for users who already hold a Dataset)."""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from embedserve.errors import InputError, InputTooLong
from embedserve.indexing.ledger import DIED, RECORD_DEATHS, Ledger, work_key
from embedserve.retrieval.columns import COLUMNS, MULTIVECTOR, SPARSE_INDICES, SPARSE_VALUES
from embedserve.retrieval.results import chosen_outputs

# the columns of each output in an `embedserve index` file (dense: `vector`, as always)
OUTPUT_COLUMNS = {"dense": ("vector",), **COLUMNS}

RAY_INSTALL = "embedserve index needs Ray Data: pip install 'embedserve[ray]'"
PATH_COLUMN = "path"  # the column Ray Data's include_paths adds: each record's input file
# restarts of an actor over the job, and retries of one batch on restarted actors: a record that
# kills its worker costs 1 + RECORD_DEATHS of them (`ledger`), a kill from outside one
MAX_RESTARTS = 16
MAX_TASK_RETRIES = 8


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
    # dense / sparse / multivector; None: `retrieval.results.default_outputs` of the model
    outputs: tuple[str, ...] | None = None
    device: str = "auto"
    dtype: str | None = None  # the engine's: float32 on the CPU, bfloat16 on a GPU
    batch_size: int = 256  # records per map_batches call
    workers: int | None = None  # actors; None: one per GPU, else one on the CPU
    fail_fast: bool = False
    lines: bool = False  # a .txt / .md input: a record per line (else one per file)


def require_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise ValueError(RAY_INSTALL) from None
    return ray


def id_text(value: Any) -> str:
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


@dataclass
class Rows:
    """A batch's good records being embedded: their texts by row, and the arrays filled in."""

    ids: list[str]
    texts: dict[int, str]  # row -> text, of the records to embed
    columns: dict[str, np.ndarray]  # output column -> its rows (a bad record's stays empty)
    tokens: np.ndarray
    reasons: list[str | None]

    def put(self, rows: Sequence[int], encoded: dict[str, Any], lengths: Sequence[int]) -> None:
        for name, values in encoded.items():
            target = self.columns[name]
            for i, value in zip(rows, values, strict=True):  # an object column: row by row
                target[i] = value
        self.tokens[list(rows)] = lengths


class EmbedBatch:
    """The actor `map_batches` runs: one Embedder, records in, vectors and errors out."""

    def __init__(self, options: IndexOptions, cpu_threads: int = 0, job: str = "") -> None:
        from embedserve.embedder import Embedder

        if cpu_threads:
            # NOTE: Ray sets OMP_NUM_THREADS to the actor's logical CPUs (1, so that the readers
            # get the others); the model's threads are the share of the cores asked for here
            import torch

            torch.set_num_threads(cpu_threads)
        self.options = options
        self.ledger = Ledger(job or uuid.uuid4().hex[:12])
        self.embedder = Embedder(options.model, device=options.device, dtype=options.dtype)
        self.model_name = str(options.model)
        o = options
        self.input_options = self.embedder.inputs.options(
            prompt_name=o.prompt_name, input_type=o.input_type, truncate=o.truncate
        )
        self.head = self.embedder.inputs.head(None, True, o.output_dtype)
        self.outputs = chosen_outputs(o.outputs, self.embedder.spec.outputs)
        # the width and dtype of a dense row as the output dtype makes it (binary packs 8 per
        # byte), a multi-vector row's width; also warms the engine up
        self.probe, _ = self._encode(["warm-up"])

    def _encode(self, texts: list[str]) -> tuple[dict[str, Any], list[int]]:
        """The output columns of `texts` (`vector` and `retrieval.columns`' names), with each
        text's token count (for tokens/s)."""
        if self.outputs != ("dense",):
            return self._encode_outputs(texts)
        prepared = self.embedder.inputs.prepare(texts, self.input_options)
        e = self.embedder
        pooled = e.embed_ids(prepared.seqs, batch_tokens=e.engine.batch_tokens)
        lengths = [len(s) for s in prepared.seqs]
        if prepared.windows_per_input is not None:  # chunked: a text's windows together
            windows = prepared.windows_per_input
            ends = np.cumsum(windows)
            lengths = [sum(lengths[b - n : b]) for b, n in zip(ends, windows, strict=True)]
        return {"vector": self.head.apply(prepared.combine(pooled))}, lengths

    def _encode_outputs(self, texts: list[str]) -> tuple[dict[str, Any], list[int]]:
        """`Embedder.encode_outputs` in pieces under its multi-vector limit."""
        from embedserve.retrieval.runner import encode_in_pieces

        o = self.options
        encode = partial(
            self.embedder.encode_outputs,
            outputs=self.outputs,
            input_type=o.input_type,
            prompt_name=o.prompt_name,
            output_dtype=o.output_dtype,
            truncate=o.truncate,
        )
        names = [n for n in ("dense", *COLUMNS) if n in self.outputs]
        columns: dict[str, list[Any]] = {c: [] for n in names for c in OUTPUT_COLUMNS[n]}
        lengths: list[int] = []
        for _, out in encode_in_pieces(encode, texts):
            if out.dense is not None:
                columns["vector"] += list(out.dense)
            for v in out.sparse or ():
                columns[SPARSE_INDICES].append(np.asarray(v["indices"], np.int32))
                columns[SPARSE_VALUES].append(np.asarray(v["values"], np.float32))
            columns.get(MULTIVECTOR, []).extend(out.multivector or ())
            lengths += out.tokens or []
        return columns, lengths

    def _embed(self, rows: Rows) -> None:
        """The good records of a batch, all at once; one at a time after a worker died on the
        batch (see `ledger`) or when one of them is an input error (the rest still embed)."""
        good, texts = list(rows.texts), list(rows.texts.values())
        key = work_key([rows.ids[i] for i in good], texts)
        try:
            if self.ledger.begin(key):
                self._one_by_one(rows)
            else:
                try:
                    rows.put(good, *self._encode(texts))
                except InputError:
                    self._one_by_one(rows)
        except Exception:  # an error, not a death: the batch is no suspect
            self.ledger.end(key)
            raise
        self.ledger.end(key)

    def _one_by_one(self, rows: Rows) -> None:
        for i, text in rows.texts.items():
            key = work_key([rows.ids[i]], [text])
            deaths = self.ledger.begin(key)
            try:
                if deaths >= RECORD_DEATHS:
                    rows.reasons[i] = DIED.format(n=deaths)
                else:
                    rows.put([i], *self._encode([text]))
            except InputTooLong as e:  # the advice in `embedserve index` terms
                rows.reasons[i] = (
                    f"the text has {e.num_tokens} tokens, over this model's limit of "
                    f"{e.max_length}; shorten it or pass --truncate end / start"
                )
            except InputError as e:
                rows.reasons[i] = str(e).replace("input[0]", "the text")
            except Exception:
                self.ledger.end(key)
                raise
            self.ledger.end(key)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        o = self.options
        n = len(next(iter(batch.values()))) if batch else 0
        ids = [id_text(v) for v in batch[o.id_field]] if o.id_field in batch else [""] * n
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
        columns = {name: _empty_column(name, n, rows) for name, rows in self.probe.items()}
        tokens = np.zeros(n, dtype=np.int64)
        if good:
            chosen = {i: str(texts[i]) for i in good}  # type: ignore[index]
            self._embed(Rows(ids, chosen, columns, tokens, reasons))
        if o.fail_fast and any(reasons):
            k = next(i for i in range(n) if reasons[i])
            raise ValueError(f"record {ids[k]!r}: {reasons[k]}")
        out = {
            "id": np.array(ids, dtype=object),
            **columns,
            "error": np.array([r or "" for r in reasons], dtype=object),
            "model": np.array([self.model_name] * n, dtype=object),
            "dims": np.full(n, self.embedder.dimensions, dtype=np.int32),
            "output_dtype": np.array([o.output_dtype] * n, dtype=object),
            "tokens": tokens,
        }
        if PATH_COLUMN in batch:
            out[PATH_COLUMN] = batch[PATH_COLUMN]
        return out


def _empty_column(name: str, n: int, probe: Any) -> np.ndarray:
    """A column of `n` rows shaped like `probe`'s first: dense vectors in one array (a bad
    record's row zero); sparse and multi-vector rows, of varying length, as objects (empty)."""
    first = np.asarray(probe[0])
    if name == "vector":
        return np.zeros((n, first.shape[0]), dtype=first.dtype)
    out = np.empty(n, dtype=object)
    for i in range(n):
        out[i] = first[:0]
    return out


def _cluster_gpus(ray: Any) -> int:
    """GPUs of the Ray cluster the job runs on (every node's, not only this machine's)."""
    if ray.is_initialized():
        return int(ray.cluster_resources().get("GPU", 0))
    from embedserve.gpus import visible_gpus

    return visible_gpus()


def actor_gpus(ray: Any, options: IndexOptions) -> int:
    """GPUs the job's actors get (one each): the cluster's, unless the device is the CPU."""
    return _cluster_gpus(ray) if options.device in ("auto", "cuda") else 0


def embed_dataset(ds: Any, options: IndexOptions | None = None, **fields: Any) -> Any:
    """A Ray Dataset of records -> a Dataset with `id`, `vector` (and / or the sparse and
    multi-vector columns of `options.outputs`: each row an array), `error`, `model`, `dims`,
    `output_dtype`, `tokens` (`error` non-empty where the record could not be embedded),
    embedded on an actor pool: one actor per GPU of the cluster (each owning one), else
    `options.workers` CPU actors. Options as an `IndexOptions` or as its fields
    (`embed_dataset(ds, model="minilm", input_type="document")`)."""
    options = replace(options or IndexOptions(), **fields)
    ray = require_ray()
    gpus = actor_gpus(ray, options)
    workers = options.workers or max(gpus, 1)
    # an actor that dies (a killed worker) is restarted and its batch retried, so each record
    # still comes out once; a bounded number of times, and a record that keeps killing its
    # worker is reported as an error (`ledger`) rather than retried for ever
    remote: dict[str, Any] = {"max_restarts": MAX_RESTARTS, "max_task_retries": MAX_TASK_RETRIES}
    threads = 0 if gpus else max(1, (os.cpu_count() or 1) // workers)
    with warnings.catch_warnings():
        # NOTE: Ray 2.5x deprecates passing remote options as keywords, yet has no other way
        # to bound the restarts of a map_batches actor
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        return ds.map_batches(
            EmbedBatch,
            fn_constructor_args=(options, threads, uuid.uuid4().hex[:12]),
            batch_size=options.batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=workers),
            num_gpus=1 if gpus else 0,
            num_cpus=1,
            **remote,
        )
