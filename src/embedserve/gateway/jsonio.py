"""JSON in and out: orjson when it is installed (NumPy rows written directly), else `json`."""

from __future__ import annotations

import json
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


def duplicate_key(data: bytes, parsed: Any) -> str | None:
    """A key that appears twice in the top-level object of `data` (a JSON parser keeps the last
    one silently), or None. NOTE: cheap first: only a key whose quoted name occurs more than once
    in the raw bytes sends the body through a second, checking parse."""
    if not isinstance(parsed, dict) or not any(
        data.count(b'"' + k.encode() + b'"') > 1 for k in parsed
    ):
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
    except ValueError:
        return None
    top = per_object[-1] if per_object else []
    return top[0] if top else None
