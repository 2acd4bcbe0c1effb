"""The bad-request battery: every malformed request gets its documented status and an
OpenAI-shaped error body, and the server still answers correctly afterwards."""

from __future__ import annotations

import contextlib
import http.client
import json
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest

pytestmark = pytest.mark.slow

OK = {"input": "a valid request"}


def j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def with_(**fields: Any) -> bytes:
    return j({"input": "hello", **fields})


# (name, method, path, body, status, error code, param)
BATTERY: list[tuple[str, str, str, bytes, int, str | None, str | None]] = [
    ("truncated json", "POST", "/v1/embeddings", b'{"input": ', 400, "invalid_json", None),
    ("empty body", "POST", "/v1/embeddings", b"", 400, "invalid_json", None),
    ("not json", "POST", "/v1/embeddings", b"input=hello", 400, "invalid_json", None),
    ("json array body", "POST", "/v1/embeddings", j(["hello"]), 400, "invalid_type", None),
    ("json string body", "POST", "/v1/embeddings", j("hello"), 400, "invalid_type", None),
    (
        "invalid utf-8",
        "POST",
        "/v1/embeddings",
        b'{"input": "\xff\xfe\xfa"}',
        400,
        "invalid_json",
        None,
    ),
    (
        "NaN literal",
        "POST",
        "/v1/embeddings",
        b'{"input": "a", "dimensions": NaN}',
        400,
        "invalid_json",
        None,
    ),
    (
        "deep nesting",
        "POST",
        "/v1/embeddings",
        b'{"input": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        400,
        "invalid_json",
        None,
    ),
    (
        "missing input",
        "POST",
        "/v1/embeddings",
        j({"model": "minilm"}),
        400,
        "missing_required_parameter",
        "input",
    ),
    (
        "null input",
        "POST",
        "/v1/embeddings",
        j({"input": None}),
        400,
        "missing_required_parameter",
        "input",
    ),
    ("int input", "POST", "/v1/embeddings", j({"input": 3}), 400, "invalid_type", "input"),
    ("float input", "POST", "/v1/embeddings", j({"input": 3.5}), 400, "invalid_type", "input"),
    (
        "object input",
        "POST",
        "/v1/embeddings",
        j({"input": {"text": "a"}}),
        400,
        "invalid_type",
        "input",
    ),
    ("empty string", "POST", "/v1/embeddings", j({"input": ""}), 400, "invalid_value", "input"),
    ("empty list", "POST", "/v1/embeddings", j({"input": []}), 400, "invalid_value", "input"),
    # empty after the tokenizer's normalization: refused as "" is (issue 40 item 7)
    ("NUL alone", "POST", "/v1/embeddings", j({"input": "\u0000"}), 400, "invalid_value", "input"),
    (
        "blank in list",
        "POST",
        "/v1/embeddings",
        j({"input": ["a", " \t"]}),
        400,
        "invalid_value",
        "input",
    ),
    (
        "empty string in list",
        "POST",
        "/v1/embeddings",
        j({"input": ["a", ""]}),
        400,
        "invalid_value",
        "input",
    ),
    (
        "mixed str and int",
        "POST",
        "/v1/embeddings",
        j({"input": ["a", 1]}),
        400,
        "invalid_type",
        "input",
    ),
    (
        "null in list",
        "POST",
        "/v1/embeddings",
        j({"input": ["a", None]}),
        400,
        "invalid_type",
        "input",
    ),
    (
        "null first in list",
        "POST",
        "/v1/embeddings",
        j({"input": [None]}),
        400,
        "invalid_type",
        "input",
    ),
    (
        "nested strings",
        "POST",
        "/v1/embeddings",
        j({"input": [["a", "b"]]}),
        400,
        "invalid_type",
        "input",
    ),
    (
        "triple nesting",
        "POST",
        "/v1/embeddings",
        j({"input": [[[101, 102]]]}),
        400,
        "invalid_type",
        "input",
    ),
    (
        "empty id list",
        "POST",
        "/v1/embeddings",
        j({"input": [[101, 102], []]}),
        400,
        "invalid_value",
        "input",
    ),
    (
        "ids then string",
        "POST",
        "/v1/embeddings",
        j({"input": [101, "a"]}),
        400,
        "invalid_type",
        "input",
    ),
    (
        "float ids",
        "POST",
        "/v1/embeddings",
        j({"input": [101.0, 102]}),
        400,
        "invalid_type",
        "input",
    ),
    (
        "bool ids",
        "POST",
        "/v1/embeddings",
        j({"input": [True, False]}),
        400,
        "invalid_type",
        "input",
    ),
    (
        "id over vocab",
        "POST",
        "/v1/embeddings",
        j({"input": [101, 30522]}),
        400,
        "invalid_token_id",
        "input",
    ),
    (
        "negative id",
        "POST",
        "/v1/embeddings",
        j({"input": [[101, -1]]}),
        400,
        "invalid_token_id",
        "input",
    ),
    ("huge id", "POST", "/v1/embeddings", j({"input": [2**62]}), 400, "invalid_token_id", "input"),
    (
        "ids too long",
        "POST",
        "/v1/embeddings",
        j({"input": [101] * 300}),
        400,
        "context_length_exceeded",
        "input",
    ),
    (
        "huge string",
        "POST",
        "/v1/embeddings",
        j({"input": "word " * 200_000}),
        400,
        "context_length_exceeded",
        "input",
    ),
    (
        "too many inputs",
        "POST",
        "/v1/embeddings",
        j({"input": ["a"] * 2049}),
        400,
        "too_many_inputs",
        "input",
    ),
    (
        "too many tokens",
        "POST",
        "/v1/embeddings",
        j({"input": [[101] * 250] * 100}),
        400,
        "too_many_tokens",
        "input",
    ),
    (
        "dimensions zero",
        "POST",
        "/v1/embeddings",
        with_(dimensions=0),
        400,
        "invalid_value",
        "dimensions",
    ),
    (
        "dimensions negative",
        "POST",
        "/v1/embeddings",
        with_(dimensions=-5),
        400,
        "invalid_value",
        "dimensions",
    ),
    (
        "dimensions over hidden",
        "POST",
        "/v1/embeddings",
        with_(dimensions=385),
        400,
        "invalid_value",
        "dimensions",
    ),
    (
        "dimensions huge",
        "POST",
        "/v1/embeddings",
        with_(dimensions=10**12),
        400,
        "invalid_value",
        "dimensions",
    ),
    (
        "dimensions string",
        "POST",
        "/v1/embeddings",
        with_(dimensions="64"),
        400,
        "invalid_type",
        "dimensions",
    ),
    (
        "dimensions float",
        "POST",
        "/v1/embeddings",
        with_(dimensions=64.0),
        400,
        "invalid_type",
        "dimensions",
    ),
    (
        "dimensions bool",
        "POST",
        "/v1/embeddings",
        with_(dimensions=True),
        400,
        "invalid_type",
        "dimensions",
    ),
    (
        "encoding hex",
        "POST",
        "/v1/embeddings",
        with_(encoding_format="hex"),
        400,
        "invalid_value",
        "encoding_format",
    ),
    (
        "encoding int",
        "POST",
        "/v1/embeddings",
        with_(encoding_format=1),
        400,
        "invalid_type",
        "encoding_format",
    ),
    (
        "unknown field",
        "POST",
        "/v1/embeddings",
        with_(temperature=0.5),
        400,
        "unknown_parameter",
        "temperature",
    ),
    ("model int", "POST", "/v1/embeddings", with_(model=5), 400, "invalid_type", "model"),
    ("user int", "POST", "/v1/embeddings", with_(user=123), 400, "invalid_type", "user"),
    (
        "normalize string",
        "POST",
        "/v1/embeddings",
        with_(normalize="yes"),
        400,
        "invalid_type",
        "normalize",
    ),
    (
        "truncate middle",
        "POST",
        "/v1/embeddings",
        with_(truncate="middle"),
        400,
        "invalid_value",
        "truncate",
    ),
    (
        "truncate true",
        "POST",
        "/v1/embeddings",
        with_(truncate=True),
        400,
        "invalid_value",
        "truncate",
    ),
    (
        "input_type passage",
        "POST",
        "/v1/embeddings",
        with_(input_type="passage"),
        400,
        "invalid_value",
        "input_type",
    ),
    (
        "output_dtype int4",
        "POST",
        "/v1/embeddings",
        with_(output_dtype="int4"),
        400,
        "invalid_value",
        "output_dtype",
    ),
    (
        "binary needs /8",
        "POST",
        "/v1/embeddings",
        with_(output_dtype="binary", dimensions=12),
        400,
        "invalid_value",
        "dimensions",
    ),
    (
        "unknown model",
        "POST",
        "/v1/embeddings",
        with_(model="text-embedding-3-small"),
        404,
        "model_not_found",
        "model",
    ),
    ("unknown route", "POST", "/v1/embedding", j(OK), 404, "not_found", None),
    ("unknown root route", "GET", "/", b"", 404, "not_found", None),
    ("wrong method", "GET", "/v1/embeddings", b"", 405, "method_not_allowed", None),
    (
        "body too large",
        "POST",
        "/v1/embeddings",
        j({"input": "x" * 3_000_000}),
        413,
        "body_too_large",
        None,
    ),
    ("tokenize ids", "POST", "/tokenize", j({"input": [101, 102]}), 400, "invalid_type", "input"),
    (
        "tokenize unknown field",
        "POST",
        "/tokenize",
        j({"input": "a", "dimensions": 3}),
        400,
        "unknown_parameter",
        "dimensions",
    ),
]


def send(url: str, method: str, path: str, body: bytes) -> tuple[int, Any]:
    parts = urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        headers = {"Content-Type": "application/json"} if method == "POST" else {}
        # the server may answer (413) before reading a large body
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.request(method, path, body=body, headers=headers)
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


def test_the_battery_is_large_enough() -> None:
    assert len(BATTERY) >= 30
    assert len({name for name, *_ in BATTERY}) == len(BATTERY)


@pytest.mark.parametrize(
    "name, method, path, body, status, code, param", BATTERY, ids=[b[0] for b in BATTERY]
)
def test_bad_request_gets_documented_status_and_openai_error(
    each_limited: str,
    name: str,
    method: str,
    path: str,
    body: bytes,
    status: int,
    code: str | None,
    param: str | None,
) -> None:
    got_status, reply = send(each_limited, method, path, body)
    assert got_status == status, reply
    assert set(reply) == {"error"}
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    expected_type = {
        400: "invalid_request_error",
        404: "not_found_error",
        405: "invalid_request_error",
        413: "invalid_request_error",
    }
    assert error["type"] == expected_type[status]
    assert error["code"] == code
    assert error["param"] == param


def test_after_the_battery_a_valid_request_is_still_correct(each_limited: str, minilm: Any) -> None:
    for _name, method, path, body, *_ in BATTERY:  # the whole battery again, back to back
        send(each_limited, method, path, body)
    status, reply = send(each_limited, "POST", "/v1/embeddings", j({"input": ["hello", "world"]}))
    assert status == 200, reply
    got = np.array([d["embedding"] for d in reply["data"]])
    want = minilm.encode(["hello", "world"])
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.99999
    assert reply["usage"]["prompt_tokens"] == 6
