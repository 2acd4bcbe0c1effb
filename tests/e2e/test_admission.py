"""A large request within the per-request limits on an idle server: served whole, in parts the
size of the servers' batches, never refused for the queue it would have filled at once."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.e2e.conftest import Proc

pytestmark = pytest.mark.slow


def test_a_large_request_enters_the_queue_progressively() -> None:
    # a queue of 5,000 tokens, a request of ~14,000: sent whole at once it would be refused (429)
    proc = Proc(
        "serve", "--no-native", "--port", "0", "--device", "cpu", "--max-queued-tokens", "5000",
        "--max-batch-tokens", "2048",
    )  # fmt: skip
    try:
        proc.wait_for(r"embedserve server: ready on \S+ .*batch tokens 2048,")
        proc.wait_for(r"embedserve gateway: listening on .*parts of 2048 tokens\)")
        url = proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
        texts = [f"passage {i} " + "about the weather and the sea " * 8 for i in range(220)]
        request = urllib.request.Request(
            f"{url}/v1/embeddings",
            json.dumps({"input": texts}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as reply:
            body = json.loads(reply.read())
        assert body["usage"]["prompt_tokens"] > 10_000
        assert [d["index"] for d in body["data"]] == list(range(len(texts)))
    finally:
        proc.stop()
