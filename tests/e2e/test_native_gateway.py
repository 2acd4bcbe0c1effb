"""`embedserve gateway` is the native front by default: in front of a server it cannot reach
over a unix socket (an address not of this host's loopback names: 127.0.0.2), Ivy calls it
over gRPC with the link secret; its answers are the model's. Replicas that come and go (`file:`)
are the Python gateway's, which says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.conftest import Proc, free_port
from tests.e2e.test_native_replicas import _batches, _post

pytestmark = pytest.mark.slow

TEXTS = [f"text {i}: " + "a lantern over the water " * (1 + i % 5) for i in range(24)]


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Proc, int]]:
    """A server on every address with a link secret, and the gateway calling it at 127.0.0.2."""
    secret = tmp_path_factory.mktemp("secret") / "link-secret"
    secret.write_text("a-long-random-link-secret-for-the-test\n")
    port, metrics = free_port(), free_port()
    server = Proc("server", "--device", "cpu", "--dtype", "float32", "--host", "0.0.0.0",
                  "--port", str(port), "--link-secret-file", str(secret),
                  "--metrics-port", str(metrics))  # fmt: skip
    gateway = None
    try:
        server.wait_for(r"embedserve server: ready on", timeout=120)
        gateway = Proc("gateway", "--replica", f"127.0.0.2:{port}", "--link-secret-file",
                       str(secret), "--port", "0")  # fmt: skip
        url = gateway.wait_for(r"embedserve gateway: listening on (\S+)", timeout=120).group(1)
        yield url, gateway, metrics
    finally:
        if gateway is not None:
            gateway.stop()
        server.stop()


def test_plain_requests_go_over_grpc_with_the_link_secret(
    remote: tuple[str, Proc, int], minilm: Any
) -> None:
    url, gateway, metrics = remote
    said = "\n".join(gateway.lines)
    assert "native front: minilm: plain embeddings answered natively over 1 servers" in said
    before = _batches(metrics)
    answer = _post(url, "/v1/embeddings", {"input": TEXTS, "model": "minilm"})
    got = np.asarray([d["embedding"] for d in answer["data"]], dtype=np.float32)
    want = minilm.encode(TEXTS)
    cosines = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosines.min() >= 0.99999
    assert _batches(metrics) > before
    tei = np.asarray(_post(url, "/embed", {"inputs": TEXTS[:3]}), dtype=np.float32)
    np.testing.assert_allclose(tei, want[:3], atol=1e-5)
    short = _post(url, "/v1/embeddings", {"input": TEXTS[:2], "dimensions": 16})  # Python front
    assert len(short["data"][0]["embedding"]) == 16


def test_replicas_that_come_and_go_are_the_python_gateways(tmp_path: Path) -> None:
    listing = tmp_path / "replicas.txt"
    listing.write_text("127.0.0.1:9\n")
    gateway = Proc("gateway", "--replica", f"file:{listing}", "--port", "0")
    try:
        gateway.wait_for(r"embedserve gateway: listening on", timeout=120)
        said = "\n".join(gateway.lines)
        assert "the Python gateway, not the native front: replicas file:" in said
    finally:
        gateway.stop()
