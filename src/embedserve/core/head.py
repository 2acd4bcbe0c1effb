"""The output head, applied per request to pooled vectors: truncate, normalize, encode.

Encodings (every one applied after Matryoshka truncation to `dimensions`, and after
L2 normalization when it is asked for):

| dtype     | element  | rule                                                                   |
|-----------|----------|------------------------------------------------------------------------|
| float32   | float32  | the vector as computed                                                 |
| float16   | float16  | round to nearest half precision                                        |
| int8      | int8     | clip(round(127 · x), -127, 127): exact for unit vectors, whose entries |
|           |          | lie in [-1, 1]; the scale is fixed, so results never depend on the     |
|           |          | rest of the batch                                                      |
| uint8     | uint8    | the int8 value + 128                                                   |
| binary    | int8     | sign bits (x > 0 → 1) packed 8 per byte, first dimension in the most   |
|           |          | significant bit, byte value − 128 (sentence-transformers' convention)  |
| ubinary   | uint8    | the same packed bits as unsigned bytes                                 |

`binary` and `ubinary` need `dimensions` divisible by 8. Any of them can be sent as base64 of
the little-endian bytes in row-major order (`to_base64`).

Those are the *generic* rules. A model folder may declare the *pplx* rules instead
(`"output_rules": "pplx"` in `embedserve.json`, see docs/outputs.md): the native outputs of
models trained with quantization in the loop (pplx-embed). Both are applied to the pooled vector
truncated to `dimensions` and never normalized (the rule is scale-dependent by design; a request's
`normalize` only affects float outputs). `dimensions` must be at least 128 (or the hidden size,
if smaller).

| dtype     | element  | pplx rule                                                              |
|-----------|----------|------------------------------------------------------------------------|
| int8      | int8     | round(127 · tanh(x)), rounding half to even; always within [-127, 127] |
| uint8     | uint8    | the int8 value + 128                                                   |
| binary    | uint8    | sign bits (x > 0 → 1) packed 8 per byte, first dimension in the least  |
|           |          | significant bit (bit i of byte j is dimension 8j + i), as the          |
|           |          | Perplexity API documents                                               |
| ubinary   | uint8    | the same bytes                                                         |

float32 and float16 are the same under both rules. `apply_output` applies the head and the
encoding under either set of rules; a request's `Head` (checked once by `check_head`, wherever it
arrives: the offline API, the gateway, or a server decoding the wire) carries them.

NOTE: `Head` lives here, not with the inputs, so a server (which needs the head but never
tokenizes) reaches the request core through this module alone (NumPy, and the names of the
encodings and rules that `loading.spec` declares, since a model folder may name its default).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.errors import InputError, InputTypeError
from embedserve.loading.spec import OUTPUT_DTYPES, OUTPUT_RULES

# Matryoshka floor of pplx-style models: 128 ... hidden size
PPLX_MIN_DIMENSIONS = 128


def min_dimensions(rules: str, hidden_size: int) -> int:
    """The smallest `dimensions` a model under these output rules serves."""
    return min(PPLX_MIN_DIMENSIONS, hidden_size) if rules == "pplx" else 1


def check_dimensions(dimensions: int | None, hidden_size: int, minimum: int = 1) -> int:
    """The output width for a request; raises ValueError for a width the model cannot give."""
    if dimensions is None:
        return hidden_size
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise ValueError(f"dimensions must be an integer, got {type(dimensions).__name__}")
    if not minimum <= dimensions <= hidden_size:
        raise ValueError(
            f"dimensions must be between {minimum} and {hidden_size}, got {dimensions}"
        )
    return dimensions


def check_output_dtype(output_dtype: str, dimensions: int) -> str:
    if output_dtype not in OUTPUT_DTYPES:
        raise ValueError(f"output_dtype {output_dtype!r} is not one of {', '.join(OUTPUT_DTYPES)}")
    if output_dtype in ("binary", "ubinary") and dimensions % 8:
        raise ValueError(
            f"output_dtype {output_dtype!r} packs 8 dimensions per byte; "
            f"dimensions must be a multiple of 8, got {dimensions}"
        )
    return output_dtype


def apply_head(pooled: np.ndarray, dimensions: int, normalize: bool) -> np.ndarray:
    """[S, H] float32 -> [S, dimensions] float32: truncate first, then normalize (Matryoshka)."""
    out = pooled[:, :dimensions]
    if normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(out, dtype=np.float32)


def encode(vectors: np.ndarray, output_dtype: str) -> np.ndarray:
    """Encode float32 vectors [S, d] by the rules in this module's docstring."""
    if output_dtype == "float32":
        return vectors
    if output_dtype == "float16":
        return vectors.astype(np.float16)
    if output_dtype in ("int8", "uint8"):
        q = np.clip(np.rint(vectors * 127.0), -127, 127).astype(np.int8)
        return q if output_dtype == "int8" else (q.astype(np.int16) + 128).astype(np.uint8)
    if output_dtype in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=1)  # uint8, first dimension in the high bit
        return (
            packed if output_dtype == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
        )
    raise ValueError(f"output_dtype {output_dtype!r} is not one of {', '.join(OUTPUT_DTYPES)}")


def encode_pplx(pooled: np.ndarray, output_dtype: str) -> np.ndarray:
    """Encode truncated, un-normalized pooled vectors [S, d] by the pplx rules (see top)."""
    if output_dtype in ("float32", "float16"):
        return encode(pooled, output_dtype)
    if output_dtype in ("int8", "uint8"):
        # |127 · tanh(x)| <= 127: no clipping. float64, so no platform float32 tanh decides a tie
        q = np.rint(127.0 * np.tanh(pooled.astype(np.float64))).astype(np.int8)
        return q if output_dtype == "int8" else (q.astype(np.int16) + 128).astype(np.uint8)
    if output_dtype in ("binary", "ubinary"):
        return np.packbits(pooled > 0, axis=1, bitorder="little")
    raise ValueError(f"output_dtype {output_dtype!r} is not one of {', '.join(OUTPUT_DTYPES)}")


def apply_output(
    pooled: np.ndarray, dimensions: int, normalize: bool, output_dtype: str, rules: str = "generic"
) -> np.ndarray:
    """Pooled float32 [S, H] -> encoded [S, ...] under the model's output rules (see top)."""
    if rules == "generic" or output_dtype in ("float32", "float16"):
        return encode(apply_head(pooled, dimensions, normalize), output_dtype)
    if rules == "pplx":
        return encode_pplx(np.ascontiguousarray(pooled[:, :dimensions]), output_dtype)
    raise ValueError(f"output rules {rules!r} are not one of {', '.join(OUTPUT_RULES)}")


@dataclass(frozen=True)
class Head:
    """The output head of one request: truncate to `dimensions`, normalize, encode."""

    dimensions: int
    normalize: bool
    output_dtype: str
    rules: str = "generic"  # the model's output rules (see `outputs`)

    def apply(self, pooled: np.ndarray) -> np.ndarray:
        """[rows, hidden] float32 pooled vectors -> [rows, width] encoded."""
        return apply_output(pooled, self.dimensions, self.normalize, self.output_dtype, self.rules)


def check_head(
    hidden_size: int, rules: str, dimensions: Any, normalize: Any, output_dtype: Any
) -> Head:
    """A checked head: `dimensions` None means all of them, `normalize` None means True."""
    if dimensions is not None and not _is_integer(dimensions):
        raise InputTypeError(
            f"dimensions must be an integer, got {type(dimensions).__name__}", param="dimensions"
        )
    try:
        minimum = min_dimensions(rules, hidden_size)
        dims = check_dimensions(
            None if dimensions is None else int(dimensions), hidden_size, minimum
        )
    except ValueError as e:
        raise InputError(str(e), param="dimensions") from None
    if normalize is None:
        normalize = True
    if not isinstance(normalize, bool):
        raise InputTypeError(
            f"normalize must be a boolean, got {type(normalize).__name__}", param="normalize"
        )
    if not isinstance(output_dtype, str):
        raise InputTypeError(
            f"output_dtype must be a string, got {type(output_dtype).__name__}",
            param="output_dtype",
        )
    try:
        check_output_dtype(output_dtype, dims)
    except ValueError as e:  # an unknown dtype, or binary with dimensions not a multiple of 8
        param = "output_dtype" if output_dtype not in OUTPUT_DTYPES else "dimensions"
        raise InputError(str(e), param=param) from None
    return Head(dims, normalize, output_dtype, rules)


def _is_integer(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def to_base64(row: np.ndarray) -> str:
    """One encoded vector as base64 of its little-endian bytes."""
    return base64.b64encode(
        np.ascontiguousarray(row).astype(row.dtype.newbyteorder("<")).tobytes()
    ).decode("ascii")
