"""JSON in and out: orjson when it is installed (NumPy rows written directly), else `json`."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

try:
    import orjson

    JSONDecodeError: type[Exception] = orjson.JSONDecodeError
    _OPTIONS = orjson.OPT_SERIALIZE_NUMPY

    def loads(data: bytes) -> Any:
        return orjson.loads(data)

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=_OPTIONS)

except ImportError:  # the GPU machine has no orjson
    JSONDecodeError = ValueError  # json.JSONDecodeError and UnicodeDecodeError are both ValueErrors

    def _default(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return obj.tolist()
        raise TypeError(f"{type(obj).__name__} is not JSON serializable")

    def _no_constant(name: str) -> Any:
        # NOTE: json accepts NaN and Infinity, which are not JSON; orjson refuses them, and both
        # paths must give the same answer.
        raise ValueError(f"{name} is not valid JSON")

    def loads(data: bytes) -> Any:
        try:
            return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, default=_default, separators=(",", ":")).encode()


def count_strings(data: bytes) -> int:
    """An upper bound on the number of JSON strings (keys and values) in `data`, in one vectorized
    pass: unescaped quotes over two. NOTE: a parser's cost grows with the number of values, not
    bytes (16 MB of distinct keys is 3 s of orjson; one 14 MB string 20 ms), so the gateway refuses
    a body with more strings than any valid request holds before it parses it."""
    raw = np.frombuffer(data, dtype=np.uint8)
    quotes = raw == 0x22
    # NOTE: `\"` (an escaped backslash, then a real quote) is counted out too: the bound only
    # grows looser by it, never tighter.
    escaped = quotes[1:] & (raw[:-1] == 0x5C)
    return (int(np.count_nonzero(quotes)) - int(np.count_nonzero(escaped))) // 2


def duplicate_key(data: bytes, parsed: Any) -> str | None:
    """A key that appears twice in the top-level object of `data` (a JSON parser keeps the last
    one silently), or None. NOTE: cheap first: one regular-expression pass over the raw bytes
    finds the quoted names of the top-level keys; only a name seen more than once sends the body
    through a second, checking parse. The caller bounds `len(parsed)` (a request has few fields)."""
    if not isinstance(parsed, dict) or not parsed:
        return None
    names = re.compile(b"|".join(re.escape(json.dumps(k).encode()) for k in parsed))
    seen: set[bytes] = set()
    for match in names.finditer(data):
        if match.group() in seen:
            break
        seen.add(match.group())
    else:
        return None
    per_object: list[list[str]] = []  # the hook sees inner objects first, the top one last

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        twice = []
        for key, _ in items:
            if key in seen:
                twice.append(key)
            seen.add(key)
        per_object.append(twice)
        return dict(items)

    try:
        json.loads(data.decode("utf-8"), object_pairs_hook=pairs)
    except RecursionError:
        # orjson accepts 1,024 levels, the stdlib parser fewer: the body is no request either way
        raise ValueError("the JSON is nested too deeply") from None
    except ValueError:
        return None
    top = per_object[-1] if per_object else []
    return top[0] if top else None
