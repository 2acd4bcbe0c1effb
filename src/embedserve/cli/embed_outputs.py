"""`embedserve embed --outputs ...`: the sparse and multi-vector outputs of a model (any mix with
its dense vectors) from `Embedder.encode_outputs`, printed as JSON or written to Parquet in the
columns of `retrieval.columns` (one row group per piece of texts, so a large file's multi-vector
output is never all in memory at once)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from embedserve.processes import say

DENSE_COLUMN = "embedding"  # the dense column `embedserve embed` has always written


def parquet_ids(ids: list[Any] | None, n: int) -> list[Any]:
    """The `id` column: the records' ids (all as text when some records had none: one Arrow
    type), else 0, 1, ..."""
    values = ids if ids is not None else list(range(n))
    if len({type(i) for i in values}) > 1:
        values = [str(i) for i in values]
    return values


def check_outputs_file(path: Path | None, outputs: tuple[str, ...]) -> None:
    if path is not None and path.suffix != ".parquet" and outputs != ("dense",):
        raise ValueError(
            f"--output {path.name}: a .npy file holds dense vectors only; write .parquet for "
            f"--outputs {','.join(outputs)}"
        )


def run_outputs(
    encode: Callable[[Sequence[str]], Any], texts: list[str], ids: list[Any],
    multivector_dims: int, args: argparse.Namespace,
) -> int:  # fmt: skip
    """`encode` (`Embedder.encode_outputs` with the command's options) over `texts` in pieces
    (`retrieval.runner.encode_in_pieces`), printed as JSON or written to `args.output`."""
    from embedserve.retrieval.runner import encode_in_pieces

    pieces = encode_in_pieces(encode, texts)
    if args.output is None:
        _print_json(pieces, str(args.model))
        return 0
    rows = _write_parquet(args.output, pieces, parquet_ids(ids, len(texts)), multivector_dims)
    say(f"wrote {rows} rows to {args.output}", err=True)
    return 0


def _write_parquet(path: Path, pieces: Any, ids: list[Any], multivector_dims: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from embedserve.retrieval.columns import columns

    writer, rows = None, 0
    try:
        for start, out in pieces:
            n = len(out.dense) if out.dense is not None else len(out.sparse or out.multivector)
            table: dict[str, Any] = {"id": pa.array(ids[start : start + n])}
            if out.dense is not None:
                flat = pa.array(out.dense.reshape(-1))
                table[DENSE_COLUMN] = pa.FixedSizeListArray.from_arrays(flat, out.dense.shape[1])
            sparse = out.sparse
            table |= columns(
                multivector_dims,
                sparse_indices=None if sparse is None else [v["indices"] for v in sparse],
                sparse_values=None if sparse is None else [v["values"] for v in sparse],
                multivector=out.multivector,
            )
            piece = pa.table(table)
            if writer is None:
                writer = pq.ParquetWriter(path, piece.schema)
            writer.write_table(piece)
            rows += n
    finally:
        if writer is not None:
            writer.close()
    return rows


def _print_json(pieces: Any, model: str) -> None:
    doc: dict[str, Any] = {"model": model}
    for _, out in pieces:
        if out.dense is not None:
            doc.setdefault("embeddings", []).extend(out.dense.tolist())
        if out.sparse is not None:
            doc.setdefault("sparse", []).extend(out.sparse)
        if out.multivector is not None:
            doc.setdefault("multivector", []).extend(m.tolist() for m in out.multivector)
    json.dump(doc, sys.stdout)
    sys.stdout.write("\n")
