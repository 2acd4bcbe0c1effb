"""The CPU batch budget a server measures at start-up (`server.warmup.measured_batch_tokens`)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from embedserve.server import warmup


class TimedEngine:
    """An engine whose step takes `num_tokens / rate` seconds, and counts its steps."""

    def __init__(self, rate: float, device: str = "cpu") -> None:
        self.rate, self.steps = rate, 0
        self.device = SimpleNamespace(type=device)
        self.max_positions, self.batch_tokens = 512, 2048

    def step(self, batch):  # type: ignore[no-untyped-def]
        self.steps += 1
        time.sleep(batch.num_tokens / self.rate)
        return SimpleNamespace(wait=lambda: None)


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine seen as quiet: the steps here sleep, and whatever else runs meanwhile would
    read as contention and time them again (tests/engine/test_contention.py covers that)."""
    from embedserve.engine import cpu_timing
    from tests.engine.test_contention import Quiet

    monkeypatch.setattr(cpu_timing, "Neighbours", Quiet)


@pytest.mark.parametrize(
    ("rate", "budget"),
    [(40_000, 512), (10_000, 256), (1_000_000, 2048)],  # 1,000 -> 512; under 256 -> 256; cap
)
def test_a_cpu_batch_holds_what_the_cpu_runs_in_the_stated_time(
    monkeypatch: pytest.MonkeyPatch, rate: float, budget: int
) -> None:
    monkeypatch.setattr(warmup, "CPU_BATCH_SECONDS", 0.025)  # the rates scaled to a fast test
    engine = TimedEngine(rate)
    assert warmup.measured_batch_tokens(engine) == budget
    assert engine.steps == 4  # one untimed, three timed


def test_a_gpu_keeps_its_graphs_budget() -> None:
    engine = TimedEngine(1e9, device="cuda")
    assert warmup.measured_batch_tokens(engine) is None and engine.steps == 0
