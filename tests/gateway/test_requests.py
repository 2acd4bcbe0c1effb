"""Request validation and chunk planning, without processes."""

from __future__ import annotations

import pytest

from embedserve.gateway.errors import ApiError
from embedserve.gateway.pipeline import plan_chunks
from embedserve.gateway.requests import Limits, parse_embeddings, parse_tokenize

LIMITS = Limits(hidden_size=384, vocab_size=1000, max_inputs=4, model_names=("minilm", "alias"))


def test_defaults_and_every_input_shape() -> None:
    job = parse_embeddings({"input": "hi"}, LIMITS)
    assert job.texts == ["hi"] and job.token_ids is None
    assert (job.encoding_format, job.dimensions, job.normalize) == ("float", 384, True)
    assert (job.truncate, job.input_type, job.output_dtype) == (False, None, "float32")
    assert parse_embeddings({"input": ["a", "b"]}, LIMITS).texts == ["a", "b"]
    assert parse_embeddings({"input": [1, 2]}, LIMITS).token_ids == [[1, 2]]
    assert parse_embeddings({"input": [[1], [2, 3]]}, LIMITS).token_ids == [[1], [2, 3]]


def test_options_and_nulls() -> None:
    job = parse_embeddings(
        {
            "input": "x",
            "model": "alias",
            "encoding_format": "base64",
            "dimensions": 16,
            "user": "u",
            "normalize": False,
            "truncate": "start",
            "input_type": "query",
            "output_dtype": "ubinary",
        },
        LIMITS,
    )
    assert (job.encoding_format, job.dimensions, job.normalize) == ("base64", 16, False)
    assert (job.truncate, job.input_type, job.output_dtype) == ("start", "query", "ubinary")
    nulls = dict.fromkeys(["model", "encoding_format", "dimensions", "user", "normalize"])
    assert parse_embeddings({"input": "x", **nulls}, LIMITS).dimensions == 384


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"input": ["a"] * 5}, 400, "input"),
        ({"input": [1000]}, 400, "input"),
        ({"input": "x", "model": "other"}, 404, "model"),
        ({"input": "x", "dimensions": 385}, 400, "dimensions"),
        ({"input": "x", "extra": 1}, 400, "extra"),
    ],
)
def test_errors_name_the_field(body: dict, status: int, param: str) -> None:
    with pytest.raises(ApiError) as e:
        parse_embeddings(body, LIMITS)
    assert (e.value.status, e.value.param) == (status, param)
    assert e.value.body()["error"]["param"] == param


def test_tokenize_takes_text_only() -> None:
    assert parse_tokenize({"input": "x", "truncate": "end"}, LIMITS) == (["x"], "end", None)
    with pytest.raises(ApiError):
        parse_tokenize({"input": [1, 2]}, LIMITS)


def test_chunks_are_consecutive_whole_sequences_under_the_budget() -> None:
    assert list(plan_chunks([3, 3, 3, 3], 6)) == [(0, 2), (2, 4)]
    assert list(plan_chunks([10, 1, 1], 6)) == [(0, 1), (1, 3)]  # a long one goes alone
    assert list(plan_chunks([1, 1, 10], 6)) == [(0, 2), (2, 3)]
    assert list(plan_chunks([5], 6)) == [(0, 1)]


def test_pplx_limits_floor_dimensions_and_default_to_the_native_output() -> None:
    pplx = Limits(1024, 1000, 4, ("pplx",), min_dimensions=128, default_output_dtype="int8")
    job = parse_embeddings({"input": "x"}, pplx)
    assert (job.dimensions, job.output_dtype) == (1024, "int8")
    assert parse_embeddings({"input": "x", "dimensions": 128}, pplx).dimensions == 128
    assert parse_embeddings({"input": "x", "output_dtype": "float32"}, pplx).output_dtype == (
        "float32"
    )
    for bad in (1, 127, 1025):
        with pytest.raises(ApiError) as e:
            parse_embeddings({"input": "x", "dimensions": bad}, pplx)
        assert e.value.status == 400 and e.value.param == "dimensions"
        assert "between 128 and 1024" in e.value.message
