"""The server's Prometheus endpoint: engine fast-path counters and the queue, read by a real
text-format parser over HTTP."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from embedserve.engine.stats import EngineStats
from embedserve.server.metrics import ENGINE_COUNTERS, ServerCollector, start_metrics_server
from embedserve.server.stages import StageTimes


def families(port: int) -> list[Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return list(text_string_to_metric_families(reply.read().decode()))


def scrape(port: int) -> dict[str, float]:
    """Unlabelled samples by name."""
    return {s.name: s.value for f in families(port) for s in f.samples if not s.labels}


def test_engine_counters_and_queue_are_scraped() -> None:
    stats = EngineStats(captures=3, replays=41, eager_runs=5, padding_tokens=700, real_tokens=9000)
    stats.capture_seconds = 1.25
    engine = SimpleNamespace(stats=stats)
    stages = StageTimes()
    for seconds in (40e-6, 60e-6, 3.0):
        stages.observe("queue", seconds)
    stages.observe("device", 1e-4)
    service = SimpleNamespace(
        num_batches=49, scheduler=SimpleNamespace(num_queued_tokens=128), stage_times=stages
    )
    port = start_metrics_server("127.0.0.1", 0, ServerCollector.of(engine, service))
    got = scrape(port)
    assert got["embedserve_engine_graph_captures_total"] == 3
    assert got["embedserve_engine_graph_replays_total"] == 41
    assert got["embedserve_engine_eager_runs_total"] == 5
    assert got["embedserve_engine_padding_tokens_total"] == 700
    assert got["embedserve_engine_real_tokens_total"] == 9000
    assert got["embedserve_engine_capture_seconds_total"] == 1.25
    assert got["embedserve_server_batches_total"] == 49
    assert got["embedserve_server_queued_tokens"] == 128
    histogram = {
        (s.labels["stage"], s.name, s.labels.get("le")): s.value
        for f in families(port)
        if f.name == "embedserve_server_stage_seconds"
        for s in f.samples
    }
    assert histogram["queue", "embedserve_server_stage_seconds_count", None] == 3
    assert histogram["queue", "embedserve_server_stage_seconds_bucket", "5e-05"] == 1
    assert histogram["queue", "embedserve_server_stage_seconds_bucket", "0.0001"] == 2
    assert histogram["queue", "embedserve_server_stage_seconds_bucket", "+Inf"] == 3
    assert histogram["queue", "embedserve_server_stage_seconds_sum", None] == pytest.approx(3.0001)
    assert histogram["device", "embedserve_server_stage_seconds_count", None] == 1
    assert histogram["deliver", "embedserve_server_stage_seconds_count", None] == 0
    # read at scrape time: a later change shows up without any bookkeeping
    stats.replays += 1
    service.scheduler.num_queued_tokens = 0
    again = scrape(port)
    assert again["embedserve_engine_graph_replays_total"] == 42
    assert again["embedserve_server_queued_tokens"] == 0
    assert {f"{name}_total" for _, name, _ in ENGINE_COUNTERS} <= set(again)


@pytest.mark.slow
def test_server_command_serves_metrics() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "embedserve.cli.main",
            "server",
            "--device",
            "cpu",
            "--port",
            "0",
            "--metrics-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        port = None
        assert proc.stdout is not None
        for line in proc.stdout:
            if m := re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line):
                port = int(m.group(1))
                break
        assert port is not None, "no metrics line"
        got = scrape(port)
        assert got["embedserve_server_batches_total"] == 0
        assert got["embedserve_engine_graph_captures_total"] == 0  # no graphs on the CPU
    finally:
        proc.terminate()
        proc.wait(60)


def test_engine_dtype_is_an_info_metric() -> None:
    """The dtype served, which on a CPU is chosen at start-up (bf16 where native, fp32 when the
    fidelity guard refuses it), is scraped as `embedserve_engine_info`."""
    engine = SimpleNamespace(
        stats=EngineStats(), device="cpu", dtype_name="bfloat16", cpu_path="packed"
    )
    service = SimpleNamespace(
        num_batches=0, scheduler=SimpleNamespace(num_queued_tokens=0), stage_times=StageTimes()
    )
    port = start_metrics_server("127.0.0.1", 0, ServerCollector.of(engine, service))
    info = [s for f in families(port) for s in f.samples if s.name == "embedserve_engine_info"]
    labels = {"device": "cpu", "dtype": "bfloat16", "cpu_path": "packed"}
    assert [(s.labels, s.value) for s in info] == [(labels, 1.0)]
