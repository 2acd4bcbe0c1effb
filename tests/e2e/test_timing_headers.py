"""TEI's timing headers (`x-total-time`, `x-tokenization-time`, `x-queue-time`,
`x-inference-time`, whole ms) on every embedding and scoring answer, ours and TEI's routes, from
the server's own stage timings (`gateway.timing`); none on answers no server worked on."""

from __future__ import annotations

import json
import urllib.request

import pytest

pytestmark = pytest.mark.slow

HEADERS = ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")
PASSAGES = ["a passage about dense retrieval and vector search, " * 12 + str(i) for i in range(64)]


def timings(url: str, path: str, body: object | None) -> dict[str, int]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as reply:
        assert reply.status == 200
        return {h: int(reply.headers[h]) for h in HEADERS if reply.headers[h] is not None}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"input": PASSAGES}),
        ("/embed", {"inputs": PASSAGES}),
        ("/v1/rerank", {"query": "vector search", "documents": PASSAGES}),
        ("/rerank", {"query": "vector search", "texts": PASSAGES}),
        ("/v1/contextualizedembeddings", {"input": [[p[:150], p[150:300]] for p in PASSAGES]}),
    ],
)
def test_embedding_and_scoring_answers_carry_the_stage_times(
    each_served: str, path: str, body: object
) -> None:
    got = timings(each_served, path, body)
    assert set(got) == set(HEADERS), got
    # 64 passages of ~120 tokens on the CPU: the engine's run is milliseconds, not zero
    assert got["x-inference-time"] >= 1
    assert got["x-total-time"] >= max(got[h] for h in HEADERS[1:])


def test_answers_without_a_server_call_carry_none(each_served: str) -> None:
    assert timings(each_served, "/v1/models", None) == {}
    assert timings(each_served, "/tokenize", {"input": "a text"}) == {}
