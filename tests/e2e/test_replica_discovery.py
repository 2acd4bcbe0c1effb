"""Replicas found by lookup: `--replica file:PATH` and `dns:NAME:PORT` are read again every
`--resolve-interval`; servers that appear are used, servers that go are dropped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Proc, free_port
from tests.e2e.test_replica_failure import call, start_server

pytestmark = pytest.mark.slow  # the server tests; the lookup one is quick


def wait_for_replicas(url: str, count: int, seconds: float = 20.0) -> list[dict]:  # type: ignore[type-arg]
    deadline = time.time() + seconds
    while True:
        status, body = call(url, "GET", "/ready")
        replicas = body.get("replicas", [])
        if len(replicas) == count and all(r["healthy"] for r in replicas):
            return replicas
        if time.time() > deadline:
            raise AssertionError(f"wanted {count} healthy replicas, /ready said {status} {body}")
        time.sleep(0.3)


def test_a_replica_file_is_read_again(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    servers = [start_server(p) for p in ports]
    listing = tmp_path / "replicas.txt"
    listing.write_text(f"# the servers\n127.0.0.1:{ports[0]}\n")
    gateway = Proc(
        *("gateway", "--replica", f"file:{listing}", "--port", "0"),
        *("--resolve-interval", "0.5"),
    )
    try:
        url = gateway.wait_for(r"embedserve gateway: listening on (\S+)").group(1)
        wait_for_replicas(url, 1)
        body = {"input": ["a query", "another"], "model": "minilm"}
        assert call(url, "POST", "/v1/embeddings", body)[0] == 200
        listing.write_text(f"127.0.0.1:{ports[0]}\n127.0.0.1:{ports[1]}\n")
        wait_for_replicas(url, 2)
        for _ in range(6):  # both take calls
            assert call(url, "POST", "/v1/embeddings", body)[0] == 200
        listing.write_text(f"127.0.0.1:{ports[1]}\n")
        wait_for_replicas(url, 1)
        servers[0].stop()  # the dropped one is not called any more
        for _ in range(4):
            assert call(url, "POST", "/v1/embeddings", body)[0] == 200
    finally:
        gateway.stop()
        for s in servers:
            s.stop()


def test_a_dns_name_stands_for_its_addresses() -> None:
    port = free_port()
    server = start_server(port)
    gateway = Proc("gateway", "--replica", f"dns:127.0.0.1:{port}", "--port", "0")
    try:
        url = gateway.wait_for(r"embedserve gateway: listening on (\S+)").group(1)
        wait_for_replicas(url, 1)
        status, reply = call(url, "POST", "/v1/embeddings", {"input": "hi", "model": "minilm"})
        assert status == 200 and len(reply["data"][0]["embedding"]) == 384
    finally:
        gateway.stop()
        server.stop()


def test_a_bad_replica_spec_is_refused() -> None:
    from embedserve.gateway.main import GatewayConfig

    for bad in ("nohost", "dns:name", "file:"):
        with pytest.raises(ValueError, match="--replica"):
            GatewayConfig(replicas=(bad,))


def test_a_failed_lookup_removes_nothing(tmp_path: Path) -> None:
    import asyncio

    from embedserve.gateway.replicas import Replica, ReplicaPool

    listing = tmp_path / "replicas.txt"

    async def scenario() -> list[list[str]]:
        pool = ReplicaPool([f"file:{listing}"], resolve_interval=60, health_interval=0.01)
        pool.replicas.append(Replica("127.0.0.1:1"))  # found by an earlier lookup
        seen = []
        await pool.resolve_once()  # the file cannot be read: not an answer
        seen.append([r.address for r in pool.replicas])
        listing.write_text("")  # an answer: no servers
        await pool.resolve_once()
        seen.append([r.address for r in pool.replicas])
        await pool.close()
        return seen

    assert asyncio.run(scenario()) == [["127.0.0.1:1"], []]
