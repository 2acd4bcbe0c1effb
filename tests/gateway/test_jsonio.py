"""JSON in and out gives the same results with orjson and with the standard-library fallback
(the GPU machine has no orjson)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from embedserve.gateway import jsonio

DOC = {"data": [{"index": 0, "embedding": np.array([0.1, -2.5, 1 / 3], dtype=np.float32)}], "n": 7}

SCRIPT = """
import sys, json
if sys.argv[1] == "fallback":
    sys.modules["orjson"] = None  # import fails: the json fallback
import numpy as np
from embedserve.gateway import jsonio
doc = {"data": [{"index": 0, "embedding": np.array([0.1, -2.5, 1 / 3], dtype=np.float32)}], "n": 7}
out = json.loads(jsonio.dumps(doc))
try:
    jsonio.loads(b'{"input": "\\xff"}')
    bad = "accepted"
except jsonio.JSONDecodeError:
    bad = "refused"
try:
    jsonio.loads(b"[" * 100000 + b"]" * 100000)
    bad += " deep accepted"
except jsonio.JSONDecodeError:
    bad += " deep refused"
for literal in (b'{"dimensions": NaN}', b"[Infinity]", b"[-Infinity]"):
    try:
        jsonio.loads(literal)
        bad += " nan accepted"
    except jsonio.JSONDecodeError:
        bad += " nan refused"
print(json.dumps({"out": out, "bad_utf8": bad, "roundtrip": jsonio.loads(b'{"a": [1, "x"]}')}))
"""


@pytest.mark.parametrize("mode", ["orjson", "fallback"])
def test_both_json_paths_agree(mode: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    row = np.array(result["out"]["data"][0]["embedding"], dtype=np.float32)
    np.testing.assert_array_equal(row, DOC["data"][0]["embedding"])  # float32 values exact
    assert result["out"]["n"] == 7
    assert result["bad_utf8"] == "refused deep refused" + " nan refused" * 3
    assert result["roundtrip"] == {"a": [1, "x"]}


def test_in_process_dumps_is_valid_json() -> None:
    assert json.loads(jsonio.dumps(DOC))["data"][0]["index"] == 0


def test_count_strings_bounds_a_body_before_it_is_parsed() -> None:
    assert jsonio.count_strings(b'{"model": "m", "input": ["a", "b \\" c"]}') == 5
    many = b"{" + b",".join(b'"k%06d":1' % i for i in range(100_000)) + b"}"
    assert jsonio.count_strings(many) == 100_000
    assert jsonio.count_strings(b"[1, 2, 3]") == 0


def test_duplicate_key_is_found_at_the_top_level_only() -> None:
    body = b'{"input": "a", "model": "m", "input": "b"}'
    assert jsonio.duplicate_key(body, jsonio.loads(body)) == "input"
    nested = b'{"input": [{"text": "a", "text": "b"}], "text": "c"}'
    assert jsonio.duplicate_key(nested, jsonio.loads(nested)) is None
    quoted = b'{"input": "he said \\"input\\" twice: \\"input\\"", "model": "m"}'
    assert jsonio.duplicate_key(quoted, jsonio.loads(quoted)) is None


def test_duplicate_check_of_a_deep_body_is_an_input_error_not_a_crash() -> None:
    # orjson takes 1,024 levels, the stdlib parser that finds duplicates fewer
    body = b'{"input": "a", "x": ' + b"[" * 1020 + b"]" * 1020 + b', "input": "b"}'
    with pytest.raises(ValueError, match="nested too deeply"):
        jsonio.duplicate_key(body, jsonio.loads(body))


def test_duplicate_check_is_one_pass_over_a_large_body() -> None:
    # one 14 MB string: the key scan is one pass, not a pass per key
    import time

    body = b'{"model": "m", "input": "' + b"word " * 2_800_000 + b'"}'
    parsed = jsonio.loads(body)
    start = time.process_time()
    for _ in range(5):
        assert jsonio.duplicate_key(body, parsed) is None
    assert (time.process_time() - start) / 5 < 0.5  # a bound on work, far above the ~40 ms it takes
