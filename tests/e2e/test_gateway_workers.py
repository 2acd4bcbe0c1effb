"""`--workers`: the Python gateway's processes (`serve --no-native`), one that dies started
again (with backoff), counted in /metrics, `serve` serving meanwhile (issue 40, item 6: one dead
worker stopped the whole `serve`); natively, the threads of Ivy's runtime."""

from __future__ import annotations

import os
import signal
import time
import urllib.request

import psutil
import pytest

from tests.e2e.conftest import Proc
from tests.e2e.test_replica_failure import call

pytestmark = pytest.mark.slow


def workers_of(serve: Proc) -> list[psutil.Process]:
    """The gateway's workers: the grandchildren of `serve` that run uvicorn."""
    gateway = [c for c in psutil.Process(serve.proc.pid).children() if "gateway" in c.cmdline()]
    assert len(gateway) == 1
    workers = []
    for child in gateway[0].children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(child.cmdline()):
                workers.append(child)
        except psutil.Error:  # gone, or a zombie not reaped yet
            pass
    return workers


def test_a_killed_gateway_worker_is_restarted_and_counted() -> None:
    proc = Proc("serve", "--no-native", "--port", "0", "--device", "cpu", "--workers", "2")
    try:
        url = proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
        before = workers_of(proc)
        assert len(before) == 2
        os.kill(before[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = {p.pid for p in workers_of(proc)}
            if len(now) == 2 and before[0].pid not in now:
                break
            assert call(url, "POST", "/v1/embeddings", {"input": "still served"})[0] == 200
            time.sleep(0.2)
        else:
            raise AssertionError("the dead worker was not started again")
        assert proc.proc.poll() is None  # serve is still up
        deadline = time.monotonic() + 30  # the new worker sets it once it has started
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
                text = reply.read().decode()
            if "embedserve_gateway_worker_restarts 1.0" in text:
                break
            time.sleep(0.5)
        assert "embedserve_gateway_worker_restarts 1.0" in text, text[-2000:]
    finally:
        proc.stop()


def test_natively_the_workers_are_the_fronts_threads() -> None:
    proc = Proc("serve", "--port", "0", "--device", "cpu", "--workers", "3")
    try:
        url = proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
        assert call(url, "POST", "/v1/embeddings", {"input": "served"})[0] == 200
        [native] = psutil.Process(proc.proc.pid).children()  # the one native process
        names = [t.id for t in native.threads()]
        ivy = [n for n in names if _thread_name(native.pid, n) == "ivy"]
        assert len(ivy) == 3, [_thread_name(native.pid, n) for n in names]
    finally:
        proc.stop()


def _thread_name(pid: int, thread: int) -> str:
    with open(f"/proc/{pid}/task/{thread}/comm") as f:
        return f.read().strip()
