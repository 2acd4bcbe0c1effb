"""SIGTERM / Ctrl-C in the gateway's supervisor (faults IV): the handler counts the request and
signals the live workers, touching nothing of the restarts; the loop clears the restarts and
signals a worker started meanwhile, each once, and kills what is left past the grace or at a
second signal. A stop during a restart neither strands the new
worker nor breaks the restart's bookkeeping."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from embedserve.gateway import workers as workers_module
from embedserve.gateway.workers import Stop


@dataclass
class FakeProcess:
    pid: int
    alive: bool = True

    def is_alive(self) -> bool:
        return self.alive


@dataclass
class FakeWorkers:
    processes: list[FakeProcess]
    due: dict[int, float] = field(default_factory=dict)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    monkeypatch.setattr(workers_module.os, "kill", lambda pid, sig: out.append((pid, sig)))
    return out


def test_each_worker_is_signalled_once_one_started_meanwhile_too(
    sent: list[tuple[int, int]],
) -> None:
    workers = FakeWorkers([FakeProcess(10), FakeProcess(11, alive=False)], due={1: 0.0})
    stop = Stop(workers, grace=30)  # type: ignore[arg-type]
    assert not stop.carry_out() and not sent
    stop.ask(signal.SIGTERM, None)
    assert sent == [(10, signal.SIGTERM)] and workers.due == {1: 0.0}  # restarts untouched
    assert stop.carry_out() and sent == [(10, signal.SIGTERM)]
    assert workers.due == {}  # the dead worker is not started again
    workers.processes[1] = FakeProcess(12)  # started by a restart as the signal came
    stop.carry_out()
    assert sent == [(10, signal.SIGTERM), (12, signal.SIGTERM)]  # the new one too, once each


def test_a_second_signal_or_the_grace_kills_what_is_left(sent: list[tuple[int, int]]) -> None:
    workers: Any = FakeWorkers([FakeProcess(20)])
    stop = Stop(workers, grace=30)
    stop.ask(signal.SIGINT, None)
    stop.ask(signal.SIGTERM, None)  # the same stop twice at once (group + forward): one ask
    stop.carry_out()
    assert sent == [(20, signal.SIGTERM)]
    stop._first -= workers_module.AGAIN_AFTER_S  # a second later: a second ask
    stop.ask(signal.SIGINT, None)
    assert sent == [(20, signal.SIGTERM), (20, signal.SIGKILL)]
    sent.clear()
    late = Stop(FakeWorkers([FakeProcess(21)]), grace=0.0)  # type: ignore[arg-type]
    late.ask(signal.SIGTERM, None)
    time.sleep(0.01)
    late.carry_out()
    assert sent == [(21, signal.SIGTERM), (21, signal.SIGKILL)]
