"""Real processes for end-to-end tests: `embedserve serve`, or a server and a gateway apart.

Every process is started in its own session and killed in teardown, whatever the test did.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

STARTUP_TIMEOUT = 120.0


class Proc:
    """A started `embedserve` command; `wait_for(pattern)` reads its output until a line matches."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "embedserve.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=env,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("<exited>")
            self._changed.notify_all()

    def wait_for(
        self, pattern: str, timeout: float = STARTUP_TIMEOUT, start: int = 0
    ) -> re.Match[str]:
        """The first output line from index `start` on that matches `pattern`."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        i = start
        with self._changed:
            while True:
                while i < len(self.lines):
                    line = self.lines[i]
                    i += 1
                    if m := regex.search(line):
                        return m
                    if line == "<exited>":
                        raise RuntimeError("process exited:\n" + "".join(self.lines))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {pattern!r} in:\n" + "".join(self.lines))
                self._changed.wait(left)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then SIGKILL of the whole process group if it does not exit in time."""
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.proc.wait()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def served() -> Iterator[str]:
    """`embedserve serve` on the bundled model, two gateway workers; yields the base URL."""
    proc = Proc("serve", "--port", "0", "--workers", "2", "--device", "cpu")
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
        "--max-body-bytes",
        "2000000",
        "--max-tokens-per-request",
        "20000",
    )
    try:
        yield proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
    finally:
        proc.stop()
