"""HTTP calls to an embeddings server on loopback, the few shapes the benchmarks need."""

from __future__ import annotations

import http.client
import json
from typing import Any

EMBEDDINGS = "/v1/embeddings"
JSON = {"Content-Type": "application/json"}


def connect(port: int, timeout: float = 120) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)


def post_on(conn: http.client.HTTPConnection, body: bytes | str, path: str = EMBEDDINGS) -> Any:
    """POST on an open (keep-alive) connection; the decoded JSON reply, or RuntimeError with the
    status and the start of the body when it is not 200."""
    conn.request("POST", path, body=body, headers=JSON)
    reply = conn.getresponse()
    data = reply.read()
    if reply.status != 200:
        raise RuntimeError(f"HTTP {reply.status}: {data[:300]!r}")
    return json.loads(data)


def post_json(port: int, body: bytes | str | dict[str, Any], path: str = EMBEDDINGS,
              timeout: float = 120) -> Any:  # fmt: skip
    """POST on a connection of its own (a dict body is encoded); the decoded JSON reply."""
    conn = connect(port, timeout)
    try:
        return post_on(conn, json.dumps(body) if isinstance(body, dict) else body, path)
    finally:
        conn.close()


def post_status(port: int, body: object, timeout: float = 60, path: str = EMBEDDINGS) -> int:
    """POST a JSON body on a connection of its own; the reply's status, the body read and
    dropped (for load that only counts answers)."""
    conn = connect(port, timeout)
    try:
        conn.request("POST", path, json.dumps(body), JSON)
        reply = conn.getresponse()
        reply.read()
        return reply.status
    finally:
        conn.close()
