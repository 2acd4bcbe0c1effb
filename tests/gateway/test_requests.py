"""Reading HTTP bodies, without processes: what is the gateway's to check, and what it hands on."""

from __future__ import annotations

from typing import Any

import pytest

from embedserve.core.inputs import Head, InputOptions, InputPreparer
from embedserve.gateway.errors import ApiError
from embedserve.gateway.requests import Limits, parse_embeddings, parse_tokenize
from tests.gateway.conftest import api_error

LIMITS = Limits(hidden_size=384, max_inputs=4, model_names=("minilm", "alias"))


def test_defaults(inputs: InputPreparer) -> None:
    job = parse_embeddings({"input": "hi"}, LIMITS, inputs)
    assert job.inputs == "hi" and job.encoding_format == "float"
    assert job.head == Head(384, True, "float32")
    assert job.options == InputOptions("", False)


def test_options_and_nulls(inputs: InputPreparer) -> None:
    job = parse_embeddings(
        {
            "input": "x",
            "model": "alias",
            "encoding_format": "base64_packed",
            "dimensions": 16,
            "user": "u",
            "normalize": False,
            "truncate": "start",
            "input_type": "query",
            "output_dtype": "ubinary",
        },
        LIMITS,
        inputs,
    )
    assert job.encoding_format == "base64"  # packed: the row's own bytes
    assert job.head == Head(16, False, "ubinary")
    assert job.options == InputOptions("", "start")  # minilm has no query prompt
    chunk = parse_embeddings({"input": "x", "truncate": "chunk", "prompt": "q: "}, LIMITS, inputs)
    assert chunk.options == InputOptions("q: ", "chunk")
    nulls = dict.fromkeys(["model", "encoding_format", "dimensions", "user", "normalize"])
    assert parse_embeddings({"input": "x", **nulls}, LIMITS, inputs).head.dimensions == 384


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"input": ["a"] * 5}, 400, "input"),
        ({"input": "x", "model": "other"}, 404, "model"),
        ({"input": "x", "dimensions": 385}, 400, "dimensions"),
        ({"input": "x", "dimensions": "8"}, 400, "dimensions"),
        ({"input": "x", "normalize": 1}, 400, "normalize"),
        ({"input": "x", "truncate": "middle"}, 400, "truncate"),
        ({"input": "x", "prompt": "a", "prompt_name": "b"}, 400, "prompt_name"),
        ({"input": "x", "extra": 1}, 400, "extra"),
        ({}, 400, "input"),
    ],
)
def test_errors_name_the_field(
    inputs: InputPreparer, body: dict[str, Any], status: int, param: str
) -> None:
    error = api_error(lambda: parse_embeddings(body, LIMITS, inputs))
    assert (error.status, error.param) == (status, param)
    assert error.body()["error"]["param"] == param


def test_tokenize_takes_text_only(inputs: InputPreparer) -> None:
    assert parse_tokenize({"input": "x", "truncate": "end"}, LIMITS, inputs) == (
        "x",
        InputOptions("", "end"),
    )
    assert api_error(lambda: parse_tokenize({"input": [1, 2]}, LIMITS, inputs)).status == 400
    error = api_error(lambda: parse_tokenize({"input": "x", "truncate": "chunk"}, LIMITS, inputs))
    assert error.param == "truncate"


def test_pplx_heads_floor_dimensions_and_default_to_the_native_output(
    inputs: InputPreparer,
) -> None:
    import dataclasses

    spec = dataclasses.replace(
        inputs.spec, hidden_size=1024, output_rules="pplx", default_output_dtype="int8"
    )
    pplx = InputPreparer(spec, inputs.tokenizer)
    assert pplx.head() == Head(1024, True, "int8", "pplx")
    assert pplx.head(128).dimensions == 128
    assert pplx.head(output_dtype="float32").output_dtype == "float32"
    for bad in (1, 127, 1025):
        error = api_error(
            lambda bad=bad: parse_embeddings({"input": "x", "dimensions": bad}, LIMITS, pplx)
        )
        assert error.status == 400 and error.param == "dimensions"
        assert "between 128 and 1024" in error.message


@pytest.mark.parametrize("dtype", ["int8", "uint8", "binary", "ubinary", "float16"])
def test_base64_of_a_row_that_is_not_float32_is_a_400_saying_what_to_pass(
    inputs: InputPreparer, dtype: str
) -> None:
    """OpenAI clients decode base64 as float32: such bytes would be silently wrong numbers."""
    body = {"input": "x", "encoding_format": "base64", "output_dtype": dtype}
    with pytest.raises(ApiError, match="encoding_format 'float'.*'base64_packed'") as err:
        parse_embeddings(body, LIMITS, inputs)
    assert err.value.status == 400 and err.value.param == "encoding_format"
    assert (
        parse_embeddings({**body, "encoding_format": "float"}, LIMITS, inputs).head.output_dtype
        == dtype
    )
    float32 = parse_embeddings({**body, "output_dtype": "float32"}, LIMITS, inputs)
    assert float32.encoding_format == "base64"
