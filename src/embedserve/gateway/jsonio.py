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
