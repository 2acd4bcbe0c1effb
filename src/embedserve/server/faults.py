"""FAULT INJECTION, for tests only: an engine whose every step fails, in a real server process.

The end-to-end tests need a replica that breaks the way a GPU with a sticky error does (every
batch fails, the process lives) under a real `embedserve serve`, whose restarted replica must
then serve normally. So the switch is a file, claimed once:

    EMBEDSERVE_TEST_FAIL_STEPS=PATH

The first server process that finds the file PATH at start-up removes it and fails every engine
step from then on (RuntimeError "fault injection: ..."); the others, and every later one (its
replacement included), serve as usual. Unset (always, outside the tests), nothing changes: this
is read here and only here (`server.main.load_engine`), once per process.
"""

from __future__ import annotations

import os
from typing import Any

FAIL_STEPS_ENV = "EMBEDSERVE_TEST_FAIL_STEPS"


class FailingEngine:
    """`engine` with every `step` raising; everything else is the engine's own."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.failed_steps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def step(self, batch: Any) -> Any:
        self.failed_steps += 1
        raise RuntimeError(
            f"fault injection: engine step {self.failed_steps} fails ({FAIL_STEPS_ENV})"
        )


def inject_faults(engine: Any) -> Any:
    """`engine`, or a `FailingEngine` around it when this process claims the fault file."""
    path = os.environ.get(FAIL_STEPS_ENV)
    if not path:
        return engine
    try:
        os.unlink(path)  # one process alone succeeds: that one is the faulty replica
    except FileNotFoundError:
        return engine
    return FailingEngine(engine)
