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
