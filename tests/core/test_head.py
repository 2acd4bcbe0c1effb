"""The output head: dimensions (Matryoshka: truncate, then normalize), normalize, and each
output dtype's encoding, with the checks that name the bad parameter."""

from __future__ import annotations

import numpy as np
import pytest

from embedserve.errors import InputError, InputTypeError
from tests.core.request_core import head_type, preparer


def test_the_default_head_is_the_models_width_normalized_float32() -> None:
    head = preparer().head()
    assert head == head_type()(384, True, "float32", "generic")
    assert preparer().head(None, None, None) == head  # None: each default


def test_dimensions_truncate_before_normalizing() -> None:
    head = preparer().head(dimensions=3)
    out = head.apply(np.array([[3.0, 4.0, 0.0, 5.0], [0.0, 0.0, 2.0, 9.0]], dtype=np.float32))
    np.testing.assert_allclose(out, [[0.6, 0.8, 0.0], [0.0, 0.0, 1.0]], rtol=1e-6)
    assert out.dtype == np.float32 and out.flags["C_CONTIGUOUS"]


def test_without_normalize_the_values_are_kept() -> None:
    head = preparer().head(dimensions=2, normalize=False)
    out = head.apply(np.array([[3.0, 4.0, 7.0]], dtype=np.float32))
    np.testing.assert_array_equal(out, [[3.0, 4.0]])


def test_integer_dtypes_scale_by_127_and_clip() -> None:
    pooled = np.array([[0.5, -1.0, 2.0, 0.001]], dtype=np.float32)
    int8 = preparer().head(4, False, "int8").apply(pooled)
    assert int8.dtype == np.int8 and int8.tolist() == [[64, -127, 127, 0]]
    uint8 = preparer().head(4, False, "uint8").apply(pooled)
    assert uint8.dtype == np.uint8 and uint8.tolist() == [[192, 1, 255, 128]]
    half = preparer().head(4, False, "float16").apply(pooled)
    assert half.dtype == np.float16 and half.tolist() == [[0.5, -1.0, 2.0, 0.0010004043579101562]]


def test_binary_packs_sign_bits_first_dimension_highest() -> None:
    signs = np.array([[1, -1, 1, 1, -1, -1, -1, 1, -1, -1, -1, -1, -1, -1, -1, 1]], np.float32)
    ubinary = preparer().head(16, True, "ubinary").apply(signs)
    assert ubinary.dtype == np.uint8 and ubinary.tolist() == [[0b10110001, 0b00000001]]
    binary = preparer().head(16, True, "binary").apply(signs)
    assert binary.dtype == np.int8 and binary.tolist() == [[0b10110001 - 128, 1 - 128]]


@pytest.mark.parametrize(
    ("kwargs", "error", "param", "message"),
    [
        ({"dimensions": 0}, InputError, "dimensions", "between 1 and 384, got 0"),
        ({"dimensions": 385}, InputError, "dimensions", "between 1 and 384, got 385"),
        ({"dimensions": "4"}, InputTypeError, "dimensions", "must be an integer, got str"),
        ({"dimensions": True}, InputTypeError, "dimensions", "must be an integer, got bool"),
        ({"normalize": "yes"}, InputTypeError, "normalize", "must be a boolean, got str"),
        ({"output_dtype": "fp8"}, InputError, "output_dtype", "'fp8' is not one of float32"),
        ({"output_dtype": 8}, InputTypeError, "output_dtype", "must be a string, got int"),
        (
            {"dimensions": 12, "output_dtype": "binary"},
            InputError,
            "dimensions",
            "multiple of 8, got 12",
        ),
    ],
)
def test_bad_heads_name_their_parameter(
    kwargs: dict[str, object], error: type[InputError], param: str, message: str
) -> None:
    with pytest.raises(error, match=message) as caught:
        preparer().head(**kwargs)  # type: ignore[arg-type]
    assert caught.value.param == param
