"""Per-request timing headers, as text-embeddings-inference sends them with each embedding and
scoring answer (load tools and dashboards read them): `x-total-time`, `x-tokenization-time`,
`x-queue-time`, `x-inference-time`, whole milliseconds.

- tokenization: the gateway's preparing of the inputs (prompts, tokenization, windows), summed;
- queue and inference: the servers' own stage timings, sent back in each answer
  (`EmbedResponse.queue_seconds` / `inference_seconds`: queued until a batch took the part,
  then that batch's run until the answer was encoded). A request cut into parts runs them side
  by side: the longest part's queue and inference are the request's;
- total: from the request's arrival at the gateway to its answer, everything included.

A request's times live in a context variable set when it arrives (the pipeline's tasks share
it); only a request that reached a server gets the headers.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any


@dataclass
class RequestTimes:
    tokenization: float = 0.0  # seconds
    queue: float = 0.0
    inference: float = 0.0
    served: bool = False  # a server answered part of it


_TIMES: contextvars.ContextVar[RequestTimes | None] = contextvars.ContextVar(
    "embedserve_request_times", default=None
)


def track_times() -> RequestTimes:
    """The times of the request now starting (in this context)."""
    times = RequestTimes()
    _TIMES.set(times)
    return times


def add_tokenization(seconds: float) -> None:
    times = _TIMES.get()
    if times is not None:
        times.tokenization += seconds


def add_server_answer(response: Any) -> None:
    """One server answer's stage times (a server that predates them sends zeros)."""
    times = _TIMES.get()
    if times is not None:
        times.served = True
        times.queue = max(times.queue, float(getattr(response, "queue_seconds", 0.0)))
        times.inference = max(times.inference, float(getattr(response, "inference_seconds", 0.0)))


def timing_headers(times: RequestTimes, total: float) -> tuple[tuple[bytes, bytes], ...]:
    """TEI's four headers (whole milliseconds), or none when no server answered."""
    if not times.served:
        return ()
    values = (
        (b"x-total-time", total),
        (b"x-tokenization-time", times.tokenization),
        (b"x-queue-time", times.queue),
        (b"x-inference-time", times.inference),
    )
    return tuple((name, str(int(seconds * 1e3)).encode()) for name, seconds in values)
