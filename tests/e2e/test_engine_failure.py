"""A replica whose engine fails every batch (as after a sticky CUDA error: the process lives)
leaves the pool: it reports NOT_SERVING and exits, `serve` replaces it, and a client load through
the gateway sees no error once the replacement is ready. The failing engine is the test-only
fault-injection hook of `tests/server/faults.py` (`fault_env`)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embedserve.server.main import FATAL_EXIT_CODE
from tests.e2e.conftest import Proc
from tests.e2e.test_replica_failure import call
from tests.server.faults import fault_env

pytestmark = pytest.mark.slow


def health(address: str) -> str:
    """The server's health status, or UNREACHABLE."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=0.5
            )
        except grpc.RpcError:
            return "UNREACHABLE"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def test_a_replica_failing_every_batch_reports_not_serving_and_serve_replaces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    switch = tmp_path / "fail-steps"
    switch.touch()
    for name, value in fault_env(switch).items():
        monkeypatch.setenv(name, value)
    serve = Proc(
        "serve", "--no-native", "--port", "0", "--device", "cpu", "--max-failed-steps", "3"
    )
    try:
        ready = serve.wait_ready(300)
        url, [address] = ready["url"], ready["replicas"]
        assert not switch.exists()  # claimed by the one server: its replacement serves
        assert health(address) == "SERVING"
        mark = len(serve.lines)

        results: list[tuple[float, int]] = []  # (when the request was sent, its status)
        done = threading.Event()

        def load() -> None:
            while not done.is_set():
                sent = time.monotonic()
                results.append((sent, call(url, "POST", "/v1/embeddings", {"input": "x"})[0]))
                time.sleep(0.02)

        start = time.monotonic()
        loader = threading.Thread(target=load)
        loader.start()
        try:
            while (status := health(address)) == "SERVING":
                assert time.monotonic() - start < 5, "still SERVING after 5 s of failed batches"
                time.sleep(0.02)
            assert status == "NOT_SERVING", status
            print(f"NOT_SERVING {time.monotonic() - start:.2f} s after the load began")
            serve.wait_for(
                rf"server-0 exited \({FATAL_EXIT_CODE}\); restarting", timeout=10, start=mark
            )
            deadline = time.monotonic() + 120
            while call(url, "GET", "/ready")[0] != 200:
                assert time.monotonic() < deadline, "the replacement never became ready"
                time.sleep(0.05)
            replaced = time.monotonic()
            time.sleep(3)  # the load goes on through the replacement
        finally:
            done.set()
            loader.join(30)
        before = [status for sent, status in results if sent < replaced]
        after = [status for sent, status in results if sent >= replaced]
        assert 500 in before  # the failing engine's answers, before it left
        assert len(after) >= 10 and set(after) == {200}, after
        assert health(address) == "SERVING"
        assert serve.proc.poll() is None
    finally:
        assert serve.stop() == 0
