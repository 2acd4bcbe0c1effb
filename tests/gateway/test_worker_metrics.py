"""A dead gateway worker's live gauges leave /metrics (faults IV): prometheus' multiprocess mode
kept its last `replica_outstanding_tokens` in the sum for ever."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from embedserve.gateway.metrics import MULTIPROCESS_DIR
from embedserve.gateway.workers import Workers


def _dies_holding_tokens(config: object, sock: object, restarts: int) -> None:
    import prometheus_client as prom

    gauge = prom.Gauge("outstanding", "tokens", ["replica"], multiprocess_mode="livesum")
    gauge.labels("a").set(1234)
    raise SystemExit(3)


def test_a_dead_workers_live_gauges_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MULTIPROCESS_DIR, str(tmp_path))  # the spawned worker inherits it
    with socket.socket() as sock:
        workers = Workers(SimpleNamespace(workers=1), sock, _dies_holding_tokens)
        workers.processes[0].join(60)
        pid = workers.processes[0].pid
        assert [p.name for p in tmp_path.glob(f"gauge_livesum_{pid}.db")]
        assert workers.keep()  # noticed dead: its restart is due later
        assert not list(tmp_path.glob(f"gauge_livesum_{pid}.db"))
        workers.due.clear()  # no restart: the test ends here
