"""The stall watch: a loop kept busy shows in the lag histogram, a collection in the GC one, and
both reach /metrics' exposition."""

from __future__ import annotations

import asyncio
import gc
import time

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
