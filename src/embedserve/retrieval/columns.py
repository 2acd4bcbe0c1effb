"""The Parquet columns of sparse and multi-vector outputs: the one definition `embedserve embed`
and `embedserve index` write and their readers read.

- `sparse_indices`: list<int32>, a row's token ids, ascending; `sparse_values`: list<float32>,
  their weights (> 0), the same length (the `{"indices", "values"}` of `retrieval.results`, the
  shape Qdrant, Milvus and Pinecone take);
- `multivector`: list<fixed_size_list<float32, dims>>, a row's token vectors (unit length).

Dense vectors keep the column each command always wrote (`embedding` in `embed`, `vector` in
`index`). pyarrow is imported when a column is built, not with this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

SPARSE_INDICES = "sparse_indices"
SPARSE_VALUES = "sparse_values"
MULTIVECTOR = "multivector"
# the columns of each output that is not dense
COLUMNS = {"sparse": (SPARSE_INDICES, SPARSE_VALUES), "multivector": (MULTIVECTOR,)}


def fields(outputs: Sequence[str], multivector_dims: int) -> list[Any]:
    """The Arrow fields of the sparse and multi-vector `outputs` (none for dense)."""
    import pyarrow as pa

    out = []
    if "sparse" in outputs:
        out += [pa.field(SPARSE_INDICES, pa.list_(pa.int32())),
                pa.field(SPARSE_VALUES, pa.list_(pa.float32()))]  # fmt: skip
    if "multivector" in outputs:
        out.append(pa.field(MULTIVECTOR, pa.list_(pa.list_(pa.float32(), multivector_dims))))
    return out


def _offsets(lengths: Sequence[int]) -> Any:
    import pyarrow as pa

    return pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32))


def _flat(rows: Sequence[Any], dtype: Any, width: int | None = None) -> np.ndarray:
    shape = (-1,) if width is None else (-1, width)
    parts = [np.asarray(r, dtype=dtype).reshape(shape) for r in rows]
    return (
        np.concatenate(parts) if parts else np.empty((0,) if width is None else (0, width), dtype)
    )


def columns(
    multivector_dims: int,
    *,
    sparse_indices: Sequence[Any] | None = None,
    sparse_values: Sequence[Any] | None = None,
    multivector: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """Arrow arrays of the columns above, one row per item of the sequences given (each an
    array or a list: a row's indices, its values, its [tokens, dims] vectors)."""
    import pyarrow as pa

    out: dict[str, Any] = {}
    if sparse_indices is not None and sparse_values is not None:
        offsets = _offsets([len(i) for i in sparse_indices])
        out[SPARSE_INDICES] = pa.ListArray.from_arrays(
            offsets, pa.array(_flat(sparse_indices, np.int32), pa.int32())
        )
        out[SPARSE_VALUES] = pa.ListArray.from_arrays(
            offsets, pa.array(_flat(sparse_values, np.float32), pa.float32())
        )
    if multivector is not None:
        d = multivector_dims
        flat = _flat(multivector, np.float32, d)
        inner = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1), pa.float32()), d)
        out[MULTIVECTOR] = pa.ListArray.from_arrays(_offsets([len(m) for m in multivector]), inner)
    return out


def read_sparse(table: Any) -> list[dict[str, list[Any]]]:
    """A table's sparse vectors, `{"indices", "values"}` per row."""
    return [
        {"indices": i, "values": v}
        for i, v in zip(
            table[SPARSE_INDICES].to_pylist(), table[SPARSE_VALUES].to_pylist(), strict=True
        )
    ]


def read_multivector(table: Any) -> list[np.ndarray]:
    """A table's multi-vector rows, each a [tokens, dims] float32 array."""
    column = table[MULTIVECTOR].combine_chunks()
    dims = column.type.value_type.list_size
    # flatten() and offsets from their first: a sliced column's buffers hold other rows too
    flat = column.flatten().flatten().to_numpy(zero_copy_only=False).reshape(-1, dims)
    offsets = column.offsets.to_numpy()
    offsets = offsets - offsets[0]
    return [flat[offsets[i] : offsets[i + 1]] for i in range(len(column))]
