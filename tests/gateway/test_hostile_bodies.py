"""Bodies built to cost the gateway: many keys, deep nesting. Each is a 400 whose cost is bounded
by the body's bytes, not by its keys (issue 24, item 1)."""

from __future__ import annotations

import json
import time

import pytest

from embedserve.core.inputs import InputPreparer
from embedserve.gateway.errors import ApiError
from embedserve.gateway.requests import Limits
from embedserve.gateway.transport import max_json_strings, max_json_values, parse_json

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


VALUES = max_json_values(Limits(hidden_size=384, max_inputs=2048, model_names=("m",)), 300_000)


@pytest.mark.parametrize("item", [b"[]", b"{}", b"0"])
def test_sixteen_megabytes_of_values_that_are_not_strings_are_refused_before_parsing(
    item: bytes,
) -> None:
    """16 MB of `[]` parsed 3.6 s on the event loop; of `{}` took the worker to 615 MB."""
    body = b'{"input": [' + b",".join([item] * (16_000_000 // (len(item) + 1))) + b"]}"
    start = time.process_time()
    with pytest.raises(ApiError) as caught:
        parse_json(body, LIMIT, VALUES)
    cpu = time.process_time() - start
    assert caught.value.status == 400 and caught.value.code == "too_many_values"
    assert cpu < 0.1, cpu


@pytest.mark.parametrize("depth", [33, 500, 1023])
def test_a_deeply_nested_input_is_a_400_before_parsing(depth: int) -> None:
    """Nested 500-1,023 deep in `input`, a 2 KB body was a 500 (RecursionError past the parser)
    with 210 KB of traceback logged."""
    body = b'{"input": ' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(ApiError) as caught:
        parse_json(body, LIMIT, VALUES)
    assert caught.value.status == 400 and "nests" in caught.value.message


def test_the_value_bound_admits_the_largest_valid_requests() -> None:
    ids = ",".join(["101"] * 160)  # 2,048 inputs of 160 token ids: 328k values
    body = f'{{"input": [{",".join(f"[{ids}]" for _ in range(2048))}]}}'.encode()
    with pytest.raises(ApiError) as caught:
        parse_json(body, LIMIT, VALUES)
    assert caught.value.code == "too_many_values"  # over the 300k token bound
    ids = ",".join(["101"] * 145)
    body = f'{{"input": [{",".join(f"[{ids}]" for _ in range(2048))}]}}'.encode()
    assert len(parse_json(body, LIMIT, VALUES)["input"]) == 2048
    text = "a, b, c [d] {e} " * 500_000  # commas and brackets inside a string are no values
    assert parse_json(json.dumps({"input": text}).encode(), LIMIT, VALUES)["input"] == text
    nested = '{"inputs": [{"content": [{"type": "text", "text": "x"}]}]}'
    assert parse_json(nested.encode(), LIMIT, VALUES)["inputs"][0]["content"][0]["text"] == "x"


def test_the_character_count_of_a_deep_input_does_not_recurse(inputs: InputPreparer) -> None:
    from embedserve.core.bounds import text_chars

    value: list = ["x"]  # type: ignore[type-arg]
    for _ in range(5000):
        value = [value]
    assert text_chars(value, "", False, inputs.tokenizer) == 0


def test_a_token_id_past_64_bits_is_out_of_the_vocabulary_not_a_float(
    inputs: InputPreparer,
) -> None:
    """The parser reads an integer past 64 bits as a float: it was reported "found float"."""
    from embedserve.errors import InputError

    data = parse_json(b'{"input": [101, 123456789012345678901234567890, 102]}', LIMIT, VALUES)
    with pytest.raises(InputError) as caught:
        inputs.prepare(data["input"])
    assert caught.value.code == "invalid_token_id" and "outside the vocabulary" in str(caught.value)
