"""The start-up timing of the CPU's executors (`engine.cpu_timing`) on a clock where a step costs
its tokens: a small model gets every round and the most steps, a large one stays within the time
budget, and the medians are the steps' times."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedserve.engine import cpu_timing
from embedserve.engine.batch import PackedBatch


@pytest.mark.parametrize("seconds_a_token", [1e-4, 7e-3])
def test_the_timing_fits_its_budget(
    seconds_a_token: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small model (1.2 ms a query) gets every round and `QUERY_CALLS` steps of a query a
    round; a large one (84 ms a query, 3.1 s the passages: XLM-R or Qwen3 on 2 cores) one step
    of each batch a round, the warm-up step counted where it took `LONG_STEP` or more, and no
    round past `MIN_ROUNDS` once `MEASURE_SECONDS` are spent."""
    clock = [0.0]
    monkeypatch.setattr(cpu_timing, "time", type("Clock", (), {"perf_counter": lambda: clock[0]}))
    steps: dict[tuple[str, int], int] = {}
    selected: list[str] = []

    def run(model: torch.nn.Module, batch: PackedBatch) -> np.ndarray:
        clock[0] += seconds_a_token * int(batch.seqlens.sum())
        key = (selected[-1], int(batch.seqlens.sum()))
        steps[key] = steps.get(key, 0) + 1
        return np.zeros((1, 1))

    built = {"onnx": torch.nn.Module(), "packed": torch.nn.Module()}
    timing = cpu_timing.timing_batches(1000, 512)
    measured = cpu_timing.measure(built, run, timing, selected.append)
    small = seconds_a_token < 1e-3
    rounds = cpu_timing.ROUNDS if small else cpu_timing.MIN_ROUNDS
    assert selected == ["onnx", "packed"] * rounds  # the paths in turn, round after round
    for path, ms in measured.items():
        assert ms == pytest.approx(
            [seconds_a_token * sum(shape) * 1e3 for shape in cpu_timing.TIMING_SHAPES]
        )
        for shape in cpu_timing.TIMING_SHAPES[:-1]:
            step = seconds_a_token * sum(shape)
            timed = max(1, min(cpu_timing.QUERY_CALLS, int(cpu_timing.CALL_SECONDS / step)))
            warm = step >= cpu_timing.LONG_STEP  # its warm-up was its first timed step
            assert steps[(path, sum(shape))] == min(timed, 3) + rounds * timed - warm
        warm = seconds_a_token * sum(cpu_timing.PASSAGE_TOKENS) >= cpu_timing.LONG_STEP
        assert steps[(path, sum(cpu_timing.PASSAGE_TOKENS))] == 1 + rounds - warm
    assert steps[("onnx", cpu_timing.QUERY_TOKENS)] == (
        3 + rounds * cpu_timing.QUERY_CALLS if small else 1 + rounds
    )
    if not small:  # 3 rounds of 8 steps of each batch of queries took 120 s on this clock
        assert clock[0] < 30


@pytest.mark.parametrize("slower", [1.31, 1.1])
def test_a_path_far_behind_on_every_batch_is_timed_no_more(
    slower: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the first round, eager at 1.31x oneDNN's time on every batch (Qwen3-0.6B's closest
    batch on a 2-core Zen 2) is dropped, and the one path left ends the timing; at 1.1x (MiniLM's
    eager passages) it stays timed. Either way every path's medians are in the answer."""
    clock = [0.0]
    monkeypatch.setattr(cpu_timing, "time", type("Clock", (), {"perf_counter": lambda: clock[0]}))
    selected: list[str] = []
    cost = {"packed": 1e-4, "eager": 1e-4 * slower}

    def run(model: torch.nn.Module, batch: PackedBatch) -> np.ndarray:
        clock[0] += cost[selected[-1]] * int(batch.seqlens.sum())
        return np.zeros((1, 1))

    built = {"packed": torch.nn.Module(), "eager": torch.nn.Module()}
    timing = cpu_timing.timing_batches(1000, 512)
    measured = cpu_timing.measure(built, run, timing, selected.append)
    rounds = 1 if slower > cpu_timing.DROP_MARGIN else cpu_timing.ROUNDS
    assert selected == ["packed", "eager"] * rounds
    for path, ms in measured.items():
        assert ms == pytest.approx([cost[path] * sum(s) * 1e3 for s in cpu_timing.TIMING_SHAPES])
