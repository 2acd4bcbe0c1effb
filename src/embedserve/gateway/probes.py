"""The gateway's probes and metrics routes: `/health`, `/ready` (every model has a healthy
replica) and `/metrics` (Prometheus, with each replica's state as of the scrape)."""

from __future__ import annotations

from typing import Any

import prometheus_client as prom

from embedserve.gateway.errors import ApiError
from embedserve.gateway.jsonio import dumps
from embedserve.gateway.metrics import Metrics
from embedserve.gateway.models import ServedModels
from embedserve.gateway.transport import Answer

JSON = b"application/json"


class Probes:
    def __init__(self, served: ServedModels, metrics: Metrics) -> None:
        self.served = served
        self.metrics = metrics

    async def health(self, body: bytes) -> Answer:
        return 200, JSON, b'{"status":"ok"}'

    async def ready(self, body: bytes, *, detailed: bool = True) -> Answer:
        """200 while every model has a healthy server replica, else 503 (naming the models
        that have none); `detailed` (a request that passed the Host and key checks): with each
        replica's health and load, else the status only."""
        if not self.served.several:
            pool = self.served.models[0].started().replicas
            details: dict[str, Any] = (
                {"replicas": _replica_states(pool.replicas)} if detailed else {}
            )
            if pool.num_healthy == 0:
                error = ApiError(503, "no healthy server replica", code="no_healthy_replica")
                return 503, JSON, dumps({**error.body(), **details})
            return 200, JSON, dumps({"status": "ready", **details})
        pools = {m.name: m.started().replicas for m in self.served.models}
        models: dict[str, dict[str, Any]] = {
            name: {"ready": p.num_healthy > 0} for name, p in pools.items()
        }
        if detailed:
            for name, p in pools.items():
                models[name]["replicas"] = _replica_states(p.replicas)
        details = {"models": models} if detailed else {}
        missing = self.served.not_ready()
        if missing:
            error = ApiError(
                503,
                f"no healthy server replica for {', '.join(missing)}",
                code="no_healthy_replica",
            )
            return 503, JSON, dumps({**error.body(), "not_ready": missing, **details})
        return 200, JSON, dumps({"status": "ready", **details})

    def replica_labels(self) -> dict[tuple[str, ...], Any]:
        """Every started model's replicas by their gauge labels (`Metrics.refresh`)."""
        if not self.served.several:
            pipeline = self.served.models[0].pipeline
            return {(r.address,): r for r in (pipeline.replicas.replicas if pipeline else ())}
        return {
            (r.address, m.name): r
            for m in self.served.models
            if m.pipeline is not None
            for r in m.pipeline.replicas.replicas
        }

    async def prometheus(self, body: bytes) -> Answer:
        if not self.served.several:
            pipeline = self.served.models[0].pipeline
            replicas = None if pipeline is None else pipeline.replicas.replicas
            return 200, prom.CONTENT_TYPE_LATEST.encode(), self.metrics.export(replicas)
        by_model = {m.name: m.pipeline.replicas.replicas for m in self.served.models if m.pipeline}
        return 200, prom.CONTENT_TYPE_LATEST.encode(), self.metrics.export_models(by_model)


def _replica_states(replicas: list[Any]) -> list[dict[str, Any]]:
    # by id, never by address: internal addresses stay out of client answers
    return [
        {"replica": r.id, "healthy": r.healthy, "outstanding_tokens": r.outstanding_tokens}
        for r in replicas
    ]
