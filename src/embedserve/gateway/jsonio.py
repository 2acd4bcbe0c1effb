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


# NOTE: the deepest valid request is ~5 levels (Cohere's `inputs[].content[]` objects); the
# parser accepts 1,024, and code that walks a parsed value recursively (a size count, a type
# check) would hit Python's recursion limit well before that: a 500 for a 2 KB body
MAX_JSON_DEPTH = 32
_SCAN_BYTES = 1 << 20  # the precise scan's piece, for its temporaries' sake


def count_values(data: bytes, max_values: int) -> tuple[int, int]:
    """An upper bound on the JSON values other than strings in `data` (arrays, objects, numbers,
    literals: one per `[`, `{` or `,` outside strings, plus one), and the deepest nesting; the
    count stops early once past `max_values` or `MAX_JSON_DEPTH`.

    NOTE: the parser's time and memory grow with values, not bytes (16 MB of `[]` is 3.6 s of
    orjson on the event loop, 16 MB of `{}` 615 MB), so the gateway bounds them before parsing.
    A count of the characters anywhere comes first; only a body where it is large (a text full
    of commas, many objects) pays the scan that skips strings."""
    raw = np.frombuffer(data, dtype=np.uint8)
    opens = int(np.count_nonzero(raw == 0x5B)) + int(np.count_nonzero(raw == 0x7B))
    commas = int(np.count_nonzero(raw == 0x2C))
    if opens <= MAX_JSON_DEPTH and opens + commas < max_values:
        return opens + commas + 1, opens
    return _scan(raw, max_values, MAX_JSON_DEPTH)


def _scan(raw: np.ndarray, max_values: int, max_depth: int) -> tuple[int, int]:
    """`count_values`, exactly, skipping strings; a piece at a time, stopping past the limits."""
    values = depth = deepest = 0
    escaping, in_string = False, 0  # carried from piece to piece
    for start in range(0, len(raw), _SCAN_BYTES):
        piece = raw[start : start + _SCAN_BYTES]
        quotes = piece == 0x22
        escaped, escaping = _escaped(piece, escaping)
        if escaped is not None:
            quotes &= ~escaped
        inside = np.cumsum(quotes, dtype=np.uint8)
        inside &= 1
        if in_string:
            inside ^= 1
        outside = inside == 0
        opening = ((piece == 0x5B) | (piece == 0x7B)) & outside
        closing = ((piece == 0x5D) | (piece == 0x7D)) & outside
        values += int(np.count_nonzero(opening)) + int(np.count_nonzero((piece == 0x2C) & outside))
        levels = np.cumsum(opening.view(np.int8) - closing.view(np.int8), dtype=np.int32)
        deepest = max(deepest, depth + int(levels.max()))
        depth, in_string = depth + int(levels[-1]), int(inside[-1])
        if values >= max_values or deepest > max_depth:
            break
    return values + 1, deepest


def _escaped(piece: np.ndarray, escaping: bool) -> tuple[np.ndarray | None, bool]:
    """Which bytes of `piece` follow an odd run of backslashes (None: none do), and whether
    its last byte does so for the next piece. `escaping`: the previous piece ended in one.
    Backslashes are rare in text, so the work is per backslash, not per byte."""
    at = np.flatnonzero(piece == 0x5C)
    if not at.size and not escaping:
        return None, False
    escaped = np.zeros(len(piece), dtype=bool)
    if not at.size:
        escaped[0] = True
        return escaped, False
    starts = np.flatnonzero(np.diff(at, prepend=-2) != 1)  # each run's first backslash
    ends = np.append(starts[1:], len(at))  # one past each run's last
    lengths = ends - starts
    if escaping and at[0] == 0:
        lengths[0] += 1  # the run continues the previous piece's
    elif escaping:
        escaped[0] = True
    after = at[ends - 1] + 1  # the byte after each run
    odd = after[(lengths % 2 == 1) & (after < len(piece))]
    escaped[odd] = True
    last_odd = at[-1] == len(piece) - 1 and lengths[-1] % 2 == 1
    return escaped, bool(last_odd)
