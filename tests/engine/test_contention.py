"""Timings taken while other processes hold the cores are not kept as the machine's quiet
figure (faults IV): a CPU path choice measured so is not remembered, and the batch budget is
timed again and, if still contended, said to be so."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from embedserve.engine import cpu, cpu_paths, cpu_timing
from embedserve.engine.cpu_timing import Neighbours
from embedserve.engine.engine import Engine
from embedserve.server import warmup


def test_a_busy_neighbour_is_seen() -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # it has started spinning
        with Neighbours() as neighbours:
            time.sleep(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert neighbours.cores > 0.5 and neighbours.contended


class Quiet:
    """A stand-in `Neighbours`: `cores` other processes' cores whatever ran (none: tests that
    time steps stay deterministic on a busy machine)."""

    cores = 0.0

    def __enter__(self) -> Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @property
    def contended(self) -> bool:
        return self.cores > cpu_timing.CONTENDED_CORES


class _Busy(Quiet):
    cores = 1.5


def test_a_choice_measured_under_contention_is_not_remembered(
    minilm_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_paths, "_choices_file", lambda: tmp_path / "cpu-paths.json")
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)
    monkeypatch.setattr(cpu_paths, "Neighbours", _Busy)
    choice = Engine.from_folder(minilm_path, device="cpu").cpu_choice
    assert choice is not None and choice.contended_cores == 1.5 and choice.measured
    assert cpu_paths.remembered(cpu_paths.choice_key(str(minilm_path))) is None
    monkeypatch.setattr(_Busy, "cores", 0.1)  # quiet now: measured and remembered
    choice = Engine.from_folder(minilm_path, device="cpu").cpu_choice
    assert choice is not None and choice.contended_cores is None
    assert cpu_paths.remembered(cpu_paths.choice_key(str(minilm_path))) == choice.name


def test_the_batch_budget_is_timed_again_and_said_contended(
    minilm_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = Engine.from_folder(minilm_path, device="cpu", dtype="float32")
    steps: list[Any] = []
    step = engine.step
    monkeypatch.setattr(engine, "step", lambda batch: steps.append(batch) or step(batch))
    monkeypatch.setattr(cpu_timing, "Neighbours", _Busy)
    monkeypatch.setattr(warmup, "CONTENDED_PAUSE_S", 0.0)
    budget = warmup.measured_batch_tokens(engine)
    assert budget is not None and budget >= warmup.CPU_MIN_BATCH_TOKENS
    assert len(steps) == 1 + 3 * (warmup.CONTENDED_RETRIES + 1)  # a warm-up, then each try
    assert "other processes kept 1.5 cores busy" in capsys.readouterr().out
