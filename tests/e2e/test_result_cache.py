"""The result cache in real processes: `embedserve serve --cache-size` with two API keys and two
models (the bundled one under two names, a server each). A repeated text is answered from the
cache with the vector the servers gave; another key's request, or another model's, is not (the
hit counts in /metrics prove it); without `--cache-size` /metrics has no cache series."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import SERVE, Proc

pytestmark = pytest.mark.slow

KEYS = ("key-one", "key-two")
TEXT = "how do I cache embeddings"


@pytest.fixture(scope="module")
def cached() -> Iterator[str]:
    proc = Proc(*SERVE, "--model", "minilm", "--model", "other=minilm", "--workers", "1",
                "--cache-size", "10000000", "--api-key", KEYS[0], "--api-key", KEYS[1])  # fmt: skip
    try:
        yield proc.wait_for(r"embedserve: serving minilm, other at (\S+)").group(1)
    finally:
        proc.stop()


def call(url: str, path: str, key: str | None, body: Any = None) -> bytes:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as reply:
        return bytes(reply.read())


def embedding(url: str, key: str | None, model: str = "minilm") -> list[float]:
    body = {"input": [TEXT], "model": model}
    return list(json.loads(call(url, "/v1/embeddings", key, body))["data"][0]["embedding"])


def cache_counts(url: str, key: str | None) -> dict[str, float]:
    """`{name{labels}: value}` of the cache's series in /metrics."""
    text = call(url, "/metrics", key).decode()
    found = re.findall(r"^(embedserve_gateway_cache_\S+) (\S+)$", text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def test_keys_and_models_do_not_share_and_a_hit_equals_the_miss(cached: str) -> None:
    one, two = KEYS
    first = embedding(cached, one)  # a miss: the servers' vector, kept
    counts = cache_counts(cached, one)
    assert counts['embedserve_gateway_cache_misses_total{model="minilm"}'] == 1
    assert counts['embedserve_gateway_cache_hits_total{model="minilm"}'] == 0
    assert counts['embedserve_gateway_cache_entries{model="minilm"}'] == 1
    assert counts['embedserve_gateway_cache_bytes{model="minilm"}'] > 384 * 4

    assert embedding(cached, one) == first  # a hit, the same vector
    assert cache_counts(cached, one)['embedserve_gateway_cache_hits_total{model="minilm"}'] == 1

    assert embedding(cached, two) == first  # the other key: a miss of its own, same answer
    counts = cache_counts(cached, one)
    assert counts['embedserve_gateway_cache_hits_total{model="minilm"}'] == 1
    assert counts['embedserve_gateway_cache_misses_total{model="minilm"}'] == 2
    assert counts['embedserve_gateway_cache_entries{model="minilm"}'] == 2

    assert embedding(cached, one, "other") == first  # the other model: its own cache
    counts = cache_counts(cached, one)
    assert counts['embedserve_gateway_cache_misses_total{model="other"}'] == 1
    assert counts.get('embedserve_gateway_cache_hits_total{model="other"}', 0) == 0
    assert counts['embedserve_gateway_cache_hits_total{model="minilm"}'] == 1


def test_without_cache_size_nothing_is_cached(served: str) -> None:
    first = embedding(served, None)
    assert embedding(served, None) == first
    assert cache_counts(served, None) == {}
