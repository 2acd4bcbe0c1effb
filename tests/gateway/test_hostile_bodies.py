"""Bodies built to cost the gateway: many keys, deep nesting. Each is a 400 whose cost is bounded
by the body's bytes, not by its keys (issue 24, item 1)."""

from __future__ import annotations

import time

import pytest

from embedserve.gateway.errors import ApiError
from embedserve.gateway.requests import Limits
from embedserve.gateway.transport import max_json_strings, parse_json

LIMIT = max_json_strings(Limits(hidden_size=384, max_inputs=2048, model_names=("m",)))  # defaults


def refused(body: bytes) -> tuple[ApiError, float]:
    start = time.process_time()
    with pytest.raises(ApiError) as caught:
        parse_json(body, LIMIT)
    return caught.value, time.process_time() - start


def test_sixteen_megabytes_of_distinct_keys_is_refused_before_it_is_parsed() -> None:
    body = b"{" + b",".join(b'"k%07d":1' % i for i in range(1_250_000)) + b"}"
    assert len(body) > 16_000_000
    error, cpu = refused(body)
    assert error.status == 400 and error.code == "too_many_values", error.message
    # NOTE: parsing it takes orjson ~3 s and the old duplicate scan hours; the count is ~20 ms
    assert cpu < 0.1, cpu


def test_many_top_level_fields_under_the_string_bound_are_refused_before_the_key_scan() -> None:
    body = b"{" + b",".join(b'"f%d":%d' % (i, i) for i in range(1000)) + b"}"
    error, cpu = refused(body)
    assert error.status == 400 and error.code == "unknown_parameter", error.message
    assert cpu < 0.1, cpu


@pytest.mark.parametrize("depth", [10, 999, 1023, 1024, 1025, 100_000])
def test_nesting_of_any_depth_is_a_400(depth: int) -> None:
    body = b'{"input": "a", "x": ' + b"[" * depth + b"]" * depth + b', "input": "b"}'
    error, _ = refused(body)
    assert error.status == 400, error.message


def test_a_valid_request_still_parses_and_a_duplicate_key_is_still_named() -> None:
    assert parse_json(b'{"input": ["a", "b"], "model": "m"}', LIMIT) == {
        "input": ["a", "b"],
        "model": "m",
    }
    error, _ = refused(b'{"input": "a", "input": "b"}')
    assert error.code == "duplicate_key" and error.param == "input"


def test_the_string_bound_admits_the_largest_valid_requests() -> None:
    docs = ",".join(f'{{"text": "d{i}"}}' for i in range(2048))
    body = (f'{{"model": "m", "query": "q", "documents": [{docs}]}}').encode()
    assert isinstance(parse_json(body, LIMIT), dict)
    pairs = ",".join(f'"t{i}"' for i in range(2048))
    body = (f'{{"text_1": [{pairs}], "text_2": [{pairs}]}}').encode()
    assert isinstance(parse_json(body, LIMIT), dict)
