"""Priority lanes (issue 56): which lane a request's server calls take, decided here once.

Two lanes. The server takes interactive work first at every batch boundary and keeps the bulk
lane a minimum share (`server.scheduler.BULK_EVERY`); the lane travels with each server call
(`EmbedRequest.lane`: 0 interactive, 1 bulk; Tulip's calls too). The rule, in order:

1. An explicit `priority` (Cohere's field, on `/v2/embed` and `/v2/rerank`; lower is handled
   earlier, as Cohere reads it): 1 or more is bulk; 0 (Cohere's default) or absent leaves the
   choice to the rules below. Anything else (negative, not an integer) is a 400.
2. By route: scores and reranks (`/rerank`, `/v1/score`, `/v2/rerank`, TEI's and Cohere's) are
   interactive: a user waits on them.
3. By size: any other request of more than `BULK_INPUTS` inputs or more than `BULK_TOKENS`
   tokens (after tokenization, the request's whole) is bulk, and so every part of it: a
   1,200-passage request, an indexing client's batches of 32 or 64 texts; smaller ones (a
   query, a few) are interactive.

Each HTTP request runs in a task of its own, so the choice is a context variable: a route sets
what it knows (`mark`, `interactive_route`), the pipeline settles the size once the tokens are
counted (`settle`), and each server call reads `current()` when it is sent.
"""

from __future__ import annotations

import contextvars
from typing import Any

INTERACTIVE, BULK = 0, 1  # the wire's values (`EmbedRequest.lane`)
NAMES = {INTERACTIVE: "interactive", BULK: "bulk"}
# A request of more inputs or tokens than these is bulk unless its route says otherwise: a query
# is one input of tens of tokens; 2,048 tokens are 8 passages of 256, a CPU server's batch.
BULK_INPUTS = 16
BULK_TOKENS = 2048

# what the route decided (None: nothing yet), and the lane its calls take
_chosen: contextvars.ContextVar[int | None] = contextvars.ContextVar("lane_chosen", default=None)
_lane: contextvars.ContextVar[int] = contextvars.ContextVar("lane", default=INTERACTIVE)


def priority_lane(value: Any) -> int | None:
    """The lane an explicit `priority` asks for (None: absent or 0, the rule decides). Raises
    ValueError with a message for the client."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(
            f"'priority' must be an integer >= 0 (0: by route and size; 1 or more: the bulk "
            f"lane); got {value!r}"
        )
    return BULK if value > 0 else None


def mark(priority: Any) -> None:
    """A route with a `priority` field: its value read (`priority_lane`), bulk if it says so."""
    lane = priority_lane(priority)
    _chosen.set(lane)
    if lane is not None:
        _lane.set(lane)


def interactive_route() -> None:
    """A score or rerank route: interactive unless a `priority` already said bulk."""
    if _chosen.get() is None:
        _chosen.set(INTERACTIVE)
        _lane.set(INTERACTIVE)


def by_size(num_tokens: int, num_inputs: int = 1) -> int:
    """The lane of a request of `num_inputs` inputs, `num_tokens` tokens in all, whose route
    does not decide."""
    return BULK if num_tokens > BULK_TOKENS or num_inputs > BULK_INPUTS else INTERACTIVE


def settle(num_tokens: int, num_inputs: int = 1) -> None:
    """The request's tokens are counted: its lane, when its route left it to the size."""
    if _chosen.get() is None:
        _lane.set(by_size(num_tokens, num_inputs))


def current() -> int:
    """The lane of the server calls made now (interactive outside any request)."""
    return _lane.get()
