"""Real processes for end-to-end tests: `embedserve serve`, or a server and a gateway apart.

Every process is started in its own session (`embedserve.processes`) and stopped in teardown,
whatever the test did.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator

import pytest

from embedserve.processes import Child


class Proc(Child):
    """A started `embedserve` command; `wait_for(pattern)` reads its output until a line matches."""

    def __init__(self, *args: str) -> None:
        super().__init__(
            [sys.executable, "-m", "embedserve.cli.main", *args], name=f"embedserve {args[0]}"
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# `serve` fp32 on the CPU: held to the fp32 `minilm` fixture at 0.99999 (the CPU default is bf16)
SERVE = ("serve", "--port", "0", "--device", "cpu", "--dtype", "float32")
# the battery's small request limits (body 2 MB, 20k tokens)
LIMITS = ("--max-body-bytes", "2000000", "--max-tokens-per-request", "20000")


def _serving(*args: str) -> Iterator[str]:
    proc = Proc(*args)
    try:
        yield proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def served() -> Iterator[str]:
    """`embedserve serve` on the bundled model, two gateway workers; yields the base URL."""
    yield from _serving(*SERVE, "--no-native", "--workers", "2")


@pytest.fixture(scope="session")
def limited() -> Iterator[str]:
    """`embedserve serve` with small request limits, for the battery."""
    yield from _serving(*SERVE, "--no-native", *LIMITS)


@pytest.fixture(scope="session")
def native_served() -> Iterator[str]:
    """`embedserve serve --native`: Ivy answers the plain embeddings, the Python front the rest."""
    yield from _serving(*SERVE, "--native")


@pytest.fixture(scope="session")
def native_limited() -> Iterator[str]:
    yield from _serving(*SERVE, "--native", *LIMITS)


# A module that holds every front to its tests asks for `each_served` / `each_limited` instead of
# `served` / `limited`: each test runs against `serve` and against `serve --native`, which must
# give the same answers, statuses and error bodies (one set of routes and rules, docs/native.md).
FRONTS = {"python": ("served", "limited"), "native": ("native_served", "native_limited")}


@pytest.fixture(scope="session", params=list(FRONTS))
def each_served(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(FRONTS[request.param][0]))


@pytest.fixture(scope="session", params=list(FRONTS))
def each_limited(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(FRONTS[request.param][1]))
