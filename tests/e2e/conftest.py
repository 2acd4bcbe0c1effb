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


@pytest.fixture(scope="session")
def served() -> Iterator[str]:
    """`embedserve serve` on the bundled model, two gateway workers; yields the base URL."""
    # fp32 asked for: held to the fp32 `minilm` fixture at 0.99999 (the CPU default is bf16)
    proc = Proc("serve", "--port", "0", "--workers", "2", "--device", "cpu", "--dtype", "float32")
    try:
        url = proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
        yield url
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def limited() -> Iterator[str]:
    """`embedserve serve` with small request limits (body 2 MB, 20k tokens), for the battery."""
    proc = Proc(
        "serve",
        "--port",
        "0",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--max-body-bytes",
        "2000000",
        "--max-tokens-per-request",
        "20000",
    )
    try:
        yield proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
    finally:
        proc.stop()
