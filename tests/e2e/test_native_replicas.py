"""`serve` with several engines for a model: server processes behind the native front
(`cli/native_replicas.py`). Ivy answers the plain requests over the servers' unix sockets, each
part to the server with the fewest tokens outstanding; the other requests go through the
gateway's app in the same process, to the same servers. Every answer equals the model in
process; both servers take load."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from tests.e2e.conftest import SERVE, Proc

pytestmark = pytest.mark.slow

TEXTS = [f"passage {i}: " + "rain falls on the quiet harbour " * (1 + i % 9) for i in range(96)]


@pytest.fixture(scope="module")
def two_servers() -> Iterator[tuple[str, Proc, list[int]]]:
    proc = Proc(*SERVE, "--replicas", "2", "--metrics-port", "0")  # each server a free port
    try:
        url = proc.wait_for(r"embedserve: serving minilm at (\S+)", timeout=300).group(1)
        found = [re.search(r"server: metrics on http://[^:]+:(\d+)/", line) for line in proc.lines]
        yield url, proc, [int(m.group(1)) for m in found if m]
    finally:
        proc.stop()


def _post(url: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def _batches(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return float(re.search(r"^embedserve_server_batches_total (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]


def _cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))


def test_plain_requests_are_answered_natively_by_both_servers(
    two_servers: tuple[str, Proc, list[int]], minilm: Any
) -> None:
    url, proc, metrics = two_servers
    assert len(metrics) == 2
    said = "\n".join(proc.lines)
    assert "native front: minilm: plain embeddings answered natively over 2 servers" in said
    before = [_batches(port) for port in metrics]

    def embed(i: int) -> list[list[float]]:
        texts = TEXTS[i : i + 3]
        answer = _post(url, "/v1/embeddings", {"input": texts, "model": "minilm"})
        return [d["embedding"] for d in sorted(answer["data"], key=lambda d: d["index"])]

    with ThreadPoolExecutor(8) as pool:
        rows = [row for rows in pool.map(embed, range(0, len(TEXTS), 3)) for row in rows]
    got = np.asarray(rows, dtype=np.float32)
    assert _cosines(got, minilm.encode(TEXTS)).min() >= 0.99999
    after = [_batches(port) for port in metrics]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


def test_other_requests_go_through_the_python_front_to_the_same_servers(
    two_servers: tuple[str, Proc, list[int]], minilm: Any
) -> None:
    url, _, _ = two_servers
    answer = _post(url, "/v1/embeddings", {"input": TEXTS[:4], "dimensions": 32})
    got = np.asarray([d["embedding"] for d in answer["data"]], dtype=np.float32)
    assert got.shape == (4, 32)
    want = minilm.encode(TEXTS[:4], normalize=False)[:, :32]
    assert _cosines(got, want).min() >= 0.99999
    tei = _post(url, "/embed", {"inputs": TEXTS[4:6], "truncate": True})
    assert _cosines(np.asarray(tei, dtype=np.float32), minilm.encode(TEXTS[4:6])).min() >= 0.99999
    ready = urllib.request.urlopen(url + "/ready", timeout=10)
    body = json.loads(ready.read())
    assert ready.status == 200 and len(body["replicas"]) == 2
