"""Priority lanes through a real `embedserve serve` on the CPU, the Python front and the native
one: a short query sent while large bulk requests are in flight (one bulk by its Cohere
`priority`, one by its size) is answered before they finish (the interactive lane goes first at
the next batch boundary: the server's scheduler, or Tulip's)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.e2e.conftest import Proc

pytestmark = pytest.mark.slow


def post(url: str, path: str, body: Any) -> tuple[int, float]:
    """The status and the time the answer was read (perf_counter)."""
    parts = urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        reply = conn.getresponse()
        reply.read()
        return reply.status, time.perf_counter()
    finally:
        conn.close()


@pytest.mark.parametrize("front", [("--no-native",), ("--native",)], ids=["python", "native"])
def test_a_query_is_answered_while_bulk_requests_are_in_flight(front: tuple[str, ...]) -> None:
    proc = Proc("serve", "--port", "0", "--device", "cpu", "--workers", "1", *front)
    url = proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
    try:
        bulk_done: list[tuple[int, float]] = []

        def bulk(n: int) -> None:
            # distinct texts (duplicates are embedded once): about 40k tokens, bulk by their
            # priority (Cohere's route: the Python front) or their size (`serve --native`: Ivy's)
            texts = [f"{n} {i} " + "a somewhat longer passage to embed in bulk " * 8
                     for i in range(400)]  # fmt: skip
            if n == 0:
                bulk_done.append(post(url, "/v2/embed", {"texts": texts, "priority": 1}))
            else:
                bulk_done.append(post(url, "/v1/embeddings", {"input": texts}))

        workers = [threading.Thread(target=bulk, args=(n,)) for n in range(2)]
        for w in workers:
            w.start()
        time.sleep(1.5)  # the bulk parts are queued and running
        assert not bulk_done, "the bulk requests finished before the query was sent"
        sent = time.perf_counter()
        status, answered = post(url, "/v1/embeddings", {"input": "what is a lane?"})
        for w in workers:
            w.join()
        assert status == 200 and [s for s, _ in bulk_done] == [200, 200]
        assert answered < min(t for _, t in bulk_done), (
            f"the query took {answered - sent:.2f} s, after a bulk request finished"
        )
    finally:
        proc.stop()
