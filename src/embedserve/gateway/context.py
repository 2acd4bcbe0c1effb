"""What a family of routes needs from the gateway that serves it: the served models, a body parsed
and routed to one of them, the metrics. Route modules (`classify`, `dropin`) are typed against
`RouteContext`, not against `GatewayApp`, which builds them: the app imports its routes, its
routes do not import the app.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from embedserve.gateway.metrics import Metrics
    from embedserve.gateway.models import ServedModels
    from embedserve.gateway.pipeline import Pipeline
    from embedserve.gateway.requests import Limits


class RouteContext(Protocol):
    served: ServedModels
    metrics: Metrics
    max_json_strings: int  # the bounds a body is parsed under (`transport.parse_json`)
    max_json_values: int

    def served_for(
        self, body: bytes, task: str, outputs: Callable[[Any], Any] | None = None
    ) -> tuple[str, Limits, Pipeline, Any]:
        """The request's model (its name, limits and pipeline) for a route of `task`, and its
        parsed body."""
        ...
