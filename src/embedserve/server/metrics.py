"""Prometheus metrics of one server process: the engine's fast-path counters, the queue and the
time per stage of the request path (`server/stages.py`).

Read at scrape time from `EngineStats` and the scheduler (no bookkeeping on the hot path), and
served on their own HTTP port (`--metrics-port`), since the gRPC port speaks only gRPC.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from embedserve.server.stages import BUCKETS

# (EngineStats field, metric name, help); counters get Prometheus' `_total` suffix
ENGINE_COUNTERS = (
    (
        "captures",
        "embedserve_engine_graph_captures",
        "CUDA graphs captured (a bucket's second hit)",
    ),
    ("replays", "embedserve_engine_graph_replays", "Batches served by replaying a CUDA graph"),
    ("eager_runs", "embedserve_engine_eager_runs", "Batches run without a graph on the GPU path"),
    (
        "capture_failures",
        "embedserve_engine_capture_failures",
        "Buckets left eager: capture failed",
    ),
    ("capture_seconds", "embedserve_engine_capture_seconds", "Host seconds spent capturing graphs"),
    ("compiles", "embedserve_engine_compiles", "torch.compile compilations of fused ops"),
    ("compile_seconds", "embedserve_engine_compile_seconds", "Host seconds spent compiling"),
    (
        "real_tokens",
        "embedserve_engine_real_tokens",
        "Tokens of real sequences run through buckets",
    ),
    ("padding_tokens", "embedserve_engine_padding_tokens", "Tokens added to fill buckets (waste)"),
)


class ServerCollector:
    """The engine's metrics and its queue's: `batches()` launched on it, `queued_tokens()`
    waiting, and the time per stage (`stage_times`; None for a queue that keeps none: Tulip's,
    under `serve --native`)."""

    def __init__(
        self,
        engine: Any,
        batches: Callable[[], int],
        queued_tokens: Callable[[], int],
        stage_times: Any | None = None,
    ) -> None:
        self.engine = engine
        self.batches, self.queued_tokens, self.stage_times = batches, queued_tokens, stage_times

    @classmethod
    def of(cls, engine: Any, service: Any) -> ServerCollector:
        """A server's: its service's batches, queue and stage times."""
        return cls(
            engine,
            lambda: service.num_batches,
            lambda: service.scheduler.num_queued_tokens,
            service.stage_times,
        )

    def collect(self) -> Iterator[Metric]:
        dtype = getattr(self.engine, "dtype_name", None)
        if dtype is not None:  # the dtype served (a CPU's default bf16 may have fallen back)
            yield InfoMetricFamily(
                "embedserve_engine",
                "The engine's device, dtype and CPU executor (`engine.cpu_paths`)",
                value={
                    "device": str(self.engine.device),
                    "dtype": dtype,
                    "cpu_path": str(getattr(self.engine, "cpu_path", None) or ""),
                },
            )
        stats = getattr(self.engine, "stats", None)
        if stats is not None:
            for field, name, help_text in ENGINE_COUNTERS:
                yield CounterMetricFamily(name, help_text, value=getattr(stats, field))
        yield CounterMetricFamily(
            "embedserve_server_batches",
            "Batches launched on the engine",
            value=self.batches(),
        )
        yield GaugeMetricFamily(
            "embedserve_server_queued_tokens",
            "Tokens waiting in the queue",
            value=self.queued_tokens(),
        )
        if self.stage_times is None:
            return
        stages = HistogramMetricFamily(
            "embedserve_server_stage_seconds",
            "Seconds per stage of the request path: queue (per request); launch, device, "
            "encode, deliver (per batch)",
            labels=["stage"],
        )
        bounds = [*(repr(b) for b in BUCKETS), "+Inf"]
        for stage, (cumulative, total) in self.stage_times.snapshot().items():
            stages.add_metric([stage], list(zip(bounds, cumulative, strict=True)), total)
        yield stages


class ModelsCollector:
    """Several models' collectors in one process (`serve` natively): each family once, its
    samples labelled with their model's served name (`model`)."""

    def __init__(self, by_model: dict[str, ServerCollector]) -> None:
        self.by_model = by_model

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for model, collector in self.by_model.items():
            for family in collector.collect():
                out = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                out.samples += [
                    s._replace(labels={**s.labels, "model": model}) for s in family.samples
                ]
        yield from merged.values()


def start_metrics_server(host: str, port: int, collector: Any) -> int:
    """Serve `collector`'s `/metrics` on `host:port` (0: any free port) in a daemon thread; the
    port used."""
    registry = CollectorRegistry()
    registry.register(collector)
    server, _ = start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)
