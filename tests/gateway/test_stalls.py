"""The stall watch: a loop kept busy shows in the lag histogram, a collection in the GC one, and
both reach /metrics' exposition."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from embedserve.gateway.metrics import Metrics
from embedserve.gateway.stalls import LAG_INTERVAL, LoopWatch


def _samples(metrics: Metrics, name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.export(None).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.name == name
        for s in family.samples
    }


def test_a_blocked_loop_and_a_collection_are_measured_and_exported() -> None:
    metrics = Metrics()
    watch = LoopWatch(metrics.loop_lag, metrics.gc_pause)

    async def main() -> None:
        await watch.start()
        await asyncio.sleep(3 * LAG_INTERVAL)  # a few on-time ticks first
        time.sleep(0.06)  # the loop blocked for 60 ms, as a large request's work would
        await asyncio.sleep(2 * LAG_INTERVAL)
        gc.collect()
        await watch.stop()

    asyncio.run(main())
    lag = _samples(metrics, "embedserve_gateway_loop_lag_seconds")
    assert lag[("embedserve_gateway_loop_lag_seconds_count", ())] >= 3
    # the tick due while the loop was blocked came >= 50 ms late
    above_50ms = (
        lag[("embedserve_gateway_loop_lag_seconds_count", ())]
        - lag[("embedserve_gateway_loop_lag_seconds_bucket", (("le", "0.05"),))]
    )
    assert above_50ms >= 1
    pauses = _samples(metrics, "embedserve_gateway_gc_pause_seconds")
    # gc.collect() is a generation-2 pass
    assert pauses[("embedserve_gateway_gc_pause_seconds_count", (("generation", "2"),))] >= 1
    assert watch._on_gc not in gc.callbacks  # stop() unhooked it


def test_the_app_runs_the_watch_as_a_service() -> None:
    from tests.gateway.test_app import make_app  # the app around a stub pipeline

    app = make_app(None)
    assert any(isinstance(s, LoopWatch) for s in app.services)


# several gateway workers: prometheus_client's multiprocess mode, one lock for every value, held
# while a new labelled child's value is made (which allocates); collections forced at every
# allocation for a moment, so some start while that lock is held
_UNDER_LOCK = """
import asyncio, gc
from embedserve.gateway.metrics import Metrics
from embedserve.gateway.stalls import LoopWatch

metrics = Metrics()
watch = LoopWatch(metrics.loop_lag, metrics.gc_pause)

async def main():
    await watch.start()
    gc.set_threshold(1, 1000, 1000)
    for i in range(300):
        metrics.requests.labels(f"/route{i}", "200").inc()
    gc.set_threshold(700, 10, 10)
    await asyncio.sleep(0.05)
    await watch.stop()
    counts = [s.value for m in metrics.gc_pause.collect() for s in m.samples
              if s.name.endswith("_count") and s.labels["generation"] == "0"]
    print(int(sum(counts)), flush=True)

asyncio.run(main())
"""


def test_a_collection_under_the_metrics_lock_does_not_deadlock_the_worker(tmp_path: Path) -> None:
    """Observing from the GC callback itself took prometheus_client's lock again when a
    collection began while it was held: the worker hung for good (0 CPU; seen on the H200 under
    a flood, reproduced here with the earlier stalls.py). The pauses are observed from the loop's
    tick instead."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _UNDER_LOCK], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 100  # the forced generation-0 collections were recorded
