"""What the gateway tells its operator: Prometheus metrics and one log line per request.

The metrics are per worker; with several gateway workers (PROMETHEUS_MULTIPROC_DIR set by the
launcher) /metrics adds up every worker's files instead. The log line (`--log-requests`) never
holds input text: its id, route, status, time, prompt tokens, inputs and the replicas called.
A gateway of several models labels every series with its `model` too (one model: no such label,
the series as they always were).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import prometheus_client as prom
from prometheus_client.multiprocess import MultiProcessCollector

from embedserve.gateway.jsonio import dumps
from embedserve.gateway.replicas import Replica

request_log = logging.getLogger("embedserve.gateway.requests")
# the current request's [prompt tokens, inputs], for its log line: set by the handler deep in
# the call, read by the ASGI loop after the answer is sent
_REQUEST_COUNTS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "embedserve_request_counts", default=None
)
# the current request's model (several models served), for its metric labels and log line
_REQUEST_MODEL: contextvars.ContextVar[str] = contextvars.ContextVar(
    "embedserve_request_model", default=""
)
# NOTE: prometheus_client reads this when it is imported; the gateway launcher sets it for workers.
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
# the native front's answers on one route since the last scrape (`Gateway.take_counts`):
# requests, latency counts per bucket (and one over the last), seconds in all, tokens, inputs
NativeCounts = tuple[int, list[int], float, int, int]
# seconds: the request latency histogram's bounds (the native front counts in the same ones)
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)


class Metrics:
    def __init__(self, *, model_label: bool = False) -> None:
        self.registry = prom.CollectorRegistry()
        self.model_label = model_label
        by_model = ["model"] if model_label else []
        self._add_request_metrics(by_model)
        self._add_replica_metrics(by_model)
        self._add_stall_metrics()
        self._route_children: dict[tuple[str, int, str], tuple[Any, Any]] = {}
        # `serve --native`: the counts of the requests answered natively since the last scrape
        # (`native/src/ivy/stats.rs`), taken at each export
        self.native_counts: Callable[[], list[tuple[str, str, NativeCounts]]] | None = None
        # the replica series there are: (address,) or, by model, (address, model)
        self._labelled: set[tuple[str, ...]] = set()
        self._cache: list[Any] | None = None  # the result cache's series, once one reports

    def _add_request_metrics(self, by_model: list[str]) -> None:
        """Requests, their latency, tokens and inputs, and how many went to the servers merged."""
        self.requests = prom.Counter(
            "embedserve_gateway_requests",
            "HTTP requests by route and status",
            ["route", "status", *by_model],
            registry=self.registry,
        )
        self.latency = prom.Histogram(
            "embedserve_gateway_request_seconds",
            "HTTP request latency by route",
            ["route", *by_model],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = prom.Counter(
            "embedserve_gateway_prompt_tokens",
            "Prompt tokens embedded",
            by_model,
            registry=self.registry,
        )
        self.inputs = prom.Counter(
            "embedserve_gateway_inputs", "Inputs embedded", by_model, registry=self.registry
        )
        # `gateway.coalescing`: how much of a loop turn's work went to the servers together
        self.merged_calls = prom.Counter(
            "embedserve_gateway_merged_calls",
            "Server calls that carried several requests' sequences",
            by_model,
            registry=self.registry,
        )
        self.merged_requests = prom.Counter(
            "embedserve_gateway_merged_requests",
            "Requests (parts) sent inside those merged calls",
            by_model,
            registry=self.registry,
        )

    def _add_replica_metrics(self, by_model: list[str]) -> None:
        """Each replica's health and outstanding tokens; the workers' restarts."""
        # NOTE: with several workers each writes its own view (`refresh`, every second and at
        # each scrape it serves); the newest write is the value. "max" kept a replica healthy
        # (1) from a worker's old write after it had died.
        self.healthy = prom.Gauge(
            "embedserve_gateway_replica_healthy",
            "1 when the replica passes health checks",
            ["replica", *by_model],
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )
        self.outstanding = prom.Gauge(
            "embedserve_gateway_replica_outstanding_tokens",
            "Tokens sent to the replica and not answered yet",
            ["replica", *by_model],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        # set by each worker as it starts (`gateway.workers.Workers`); the largest is the gateway's
        self.worker_restarts = prom.Gauge(
            "embedserve_gateway_worker_restarts",
            "Gateway workers started again after one died",
            registry=self.registry,
            multiprocess_mode="max",
        )

    def _add_stall_metrics(self) -> None:
        """What keeps a worker's loop from running: per worker, not per model."""
        # both observed by `gateway.stalls`, on one set of buckets
        stall_buckets = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1)
        self.loop_lag = prom.Histogram(
            "embedserve_gateway_loop_lag_seconds",
            "How late a worker's event loop ran a timer due every 10 ms",
            buckets=stall_buckets,
            registry=self.registry,
        )
        self.gc_pause = prom.Histogram(
            "embedserve_gateway_gc_pause_seconds",
            "Garbage collections of a worker's heap by generation: their durations",
            ["generation"],
            buckets=stall_buckets,
            registry=self.registry,
        )

    def _model(self) -> tuple[str, ...]:
        return (_REQUEST_MODEL.get(),) if self.model_label else ()

    def route(self, route: str, status: int) -> tuple[Any, Any]:
        """The request counter and latency histogram of a route and status (and the request's
        model), looked up once."""
        model = self._model()
        key = (route, status, *model)
        found = self._route_children.get(key)  # type: ignore[arg-type]
        if found is None:
            found = (
                self.requests.labels(route, str(status), *model),
                self.latency.labels(route, *model),
            )
            self._route_children[key] = found  # type: ignore[index]
        return found

    def count(self, num_tokens: int, num_inputs: int) -> None:
        """A request's work: into the metrics, and into its log line."""
        model = self._model()
        if model:
            self.prompt_tokens.labels(*model).inc(num_tokens)
            self.inputs.labels(*model).inc(num_inputs)
        else:
            self.prompt_tokens.inc(num_tokens)
            self.inputs.inc(num_inputs)
        counts = _REQUEST_COUNTS.get()
        if counts is not None:
            counts[:] = [num_tokens, num_inputs]

    def merged(self, model: str) -> Callable[[int], None]:
        """What a model's `Coalescer` calls for each merged call (its number of requests)."""
        calls, requests = self.merged_calls, self.merged_requests
        if self.model_label:
            calls, requests = calls.labels(model), requests.labels(model)

        def count(num_requests: int) -> None:
            calls.inc()
            requests.inc(num_requests)

        return count

    def cache(self, model: str) -> CacheCounts:
        """Where a model's result cache reports (`gateway.result_cache`). Its series are
        registered at the first call: a gateway without `--cache-size` exports none of them."""
        if self._cache is None:
            self._cache = _cache_metrics(self.registry, ["model"] if self.model_label else [])
        series = self._cache
        if self.model_label:
            series = [m.labels(model) for m in series]
        return CacheCounts(*series)

    def export(self, replicas: Sequence[Replica] | None) -> bytes:
        """The text exposition of /metrics, with the replicas' state as of now."""
        return self._export({(r.address,): r for r in replicas or ()})

    def export_models(self, replicas: Mapping[str, Sequence[Replica]]) -> bytes:
        """`export` for several models: each model's replicas, labelled with its name."""
        return self._export({(r.address, m): r for m, rs in replicas.items() for r in rs})

    def refresh(self, replicas: dict[tuple[str, ...], Replica]) -> None:
        """This worker's view of the replicas into the gauges, by label (address[, model])."""
        # by address: the same server in every worker (an index named different ones); a
        # dropped replica's series go
        for labels in self._labelled - replicas.keys():
            for gauge in (self.healthy, self.outstanding):
                gauge.labels(*labels).set(0)  # NOTE: a worker's file keeps it (multiprocess)
                gauge.remove(*labels)
        self._labelled = set(replicas)
        for labels, r in replicas.items():
            self.healthy.labels(*labels).set(float(r.healthy))
            self.outstanding.labels(*labels).set(r.outstanding_tokens)

    def add_native(self, route: str, model: str, counts: NativeCounts) -> None:
        """The native front's answers on `route` for `model` since the last scrape into the
        same series: (requests, latency counts per bucket, seconds in all, tokens, inputs); all
        200s (it hands every other answer to this front)."""
        requests, buckets, seconds, tokens, inputs = counts
        if not requests:
            return
        asked = _REQUEST_MODEL.set(model)  # the series' model label, with several
        try:
            count, latency = self.route(route, 200)
            count.inc(requests)
            # NOTE: prometheus_client observes one value at a time; tens of thousands a second
            # are added to the child's own per-bucket counters (not cumulative, as `observe`
            # keeps them)
            for bucket, n in zip(latency._buckets, buckets, strict=True):
                bucket.inc(n)
            latency._sum.inc(seconds)
            labels = self._model()
            for series, n in ((self.prompt_tokens, tokens), (self.inputs, inputs)):
                (series.labels(*labels) if labels else series).inc(n)
        finally:
            _REQUEST_MODEL.reset(asked)

    def _export(self, replicas: dict[tuple[str, ...], Replica]) -> bytes:
        if self.native_counts is not None:
            for route, model, counts in self.native_counts():
                self.add_native(route, model, counts)
        self.refresh(replicas)
        registry = self.registry
        if os.environ.get(MULTIPROCESS_DIR):  # several workers: add up every worker's files
            registry = prom.CollectorRegistry()
            MultiProcessCollector(registry)
        return prom.generate_latest(registry)


def _cache_metrics(registry: prom.CollectorRegistry, by_model: list[str]) -> list[Any]:
    """The result cache's series: hits, misses and evictions (per sequence), its bytes and
    entries (with several workers, the sum of theirs: each holds its share of the size)."""
    counters = [
        prom.Counter(f"embedserve_gateway_cache_{name}", text, by_model, registry=registry)
        for name, text in (
            ("hits", "Sequences answered from the result cache"),
            ("misses", "Sequences looked up in the result cache and not found there"),
            ("evictions", "Result cache entries dropped to stay under --cache-size"),
        )
    ]
    gauges = [
        prom.Gauge(
            f"embedserve_gateway_cache_{name}",
            text,
            by_model,
            registry=registry,
            multiprocess_mode="livesum",  # each worker's share, added up
        )
        for name, text in (
            ("bytes", "Bytes the result cache holds (rows, keys and per-entry overhead)"),
            ("entries", "Rows the result cache holds"),
        )
    ]
    return counters + gauges


class CacheCounts:
    """A model's result cache's series (`result_cache.CacheStats`)."""

    def __init__(self, hits: Any, misses: Any, evictions: Any, nbytes: Any, entries: Any) -> None:
        self.hits, self.misses, self.evictions = hits, misses, evictions
        self.nbytes, self.entries = nbytes, entries

    def looked_up(self, hits: int, misses: int) -> None:
        if hits:
            self.hits.inc(hits)
        if misses:
            self.misses.inc(misses)

    def changed(self, nbytes: int, entries: int, evictions: int) -> None:
        self.nbytes.set(nbytes)
        self.entries.set(entries)
        if evictions:
            self.evictions.inc(evictions)


def set_request_model(name: str) -> None:
    """The model the request now handled goes to ("" before it is known, or one model)."""
    _REQUEST_MODEL.set(name)


def track_request() -> list[int]:
    """The [prompt tokens, inputs] of the request now starting (in this context), filled in by
    `Metrics.count`."""
    counts = [0, 0]
    _REQUEST_COUNTS.set(counts)
    return counts


def log_request(
    request_id: bytes,
    method: str,
    route: str,
    status: int,
    seconds: float,
    counts: list[int],
    replicas: set[int],
) -> None:
    request_log.info(
        dumps(
            {
                "request_id": request_id.decode("ascii"),
                "method": method,
                "route": route,
                "status": status,
                "ms": round(seconds * 1e3, 3),
                "prompt_tokens": counts[0],
                "inputs": counts[1],
                "replicas": sorted(replicas),
            }
        ).decode()
    )


class GaugeRefresh:
    """Each worker writes its replicas' gauges every `interval` s, not only when it serves a
    scrape: with several workers, the one scraped adds up every worker's files, and a worker
    that had not been scraped since a replica died still said it was healthy."""

    def __init__(self, metrics: Metrics, replicas: Callable[[], dict[tuple[str, ...], Replica]],
                 interval: float = 1.0) -> None:  # fmt: skip
        self.metrics, self.replicas, self.interval = metrics, replicas, interval
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if os.environ.get(MULTIPROCESS_DIR):  # one worker: the scrape writes them
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.metrics.refresh(self.replicas())
