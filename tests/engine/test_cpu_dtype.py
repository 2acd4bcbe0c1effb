"""The CPU's default dtype: bf16 where the cores have it natively, held to the fidelity guard;
fp32 elsewhere, when the guard fails, and whenever `dtype=` asks."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.engine import cpu
from embedserve.engine import engine as engine_module
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.engine.fidelity import FidelityError

BATCH = PackedBatch.from_token_lists([[101, 2054, 2003, 102], [101, 7592, 102]])


def test_cpu_flags_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 amx_tile\n\n")
    assert cpu.BF16_FLAGS & cpu._cpu_flags(info) == {"avx512_bf16"}
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n")
    assert not cpu.BF16_FLAGS & cpu._cpu_flags(info)
    assert cpu._cpu_flags(tmp_path / "absent") == frozenset()


def test_no_native_bf16_means_fp32_on_a_checked_executor(monkeypatch, minilm_path: Path) -> None:  # type: ignore[no-untyped-def]
    """fp32 by default: the fastest float32 executor measured at start-up, held to the float32
    guard against the eager reference (tests/engine/test_cpu_paths.py)."""
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)
    engine = Engine.from_folder(minilm_path, device="cpu")
    assert engine.dtype == torch.float32 and engine.dtype_name == "float32"
    assert engine.cpu_choice is not None and engine.cpu_path == engine.cpu_choice.path
    assert engine.fidelity_cosine is not None and engine.fidelity_cosine >= 0.99999


def test_dtype_overrides_the_cpu_default(monkeypatch, minilm_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)
    assert Engine.from_folder(minilm_path, device="cpu", dtype="bfloat16").dtype == torch.bfloat16
    monkeypatch.setattr(cpu, "native_bf16", lambda: True)
    assert Engine.from_folder(minilm_path, device="cpu", dtype="float32").dtype == torch.float32


@pytest.mark.skipif(not cpu.native_bf16(), reason="this CPU has no native bf16")
def test_native_bf16_cpu_defaults_to_checked_bf16(minilm_path: Path) -> None:
    engine = Engine.from_folder(minilm_path, device="cpu")
    assert engine.dtype == torch.bfloat16
    assert engine.fidelity_cosine is not None and engine.fidelity_cosine >= 0.999


def test_a_failed_guard_falls_back_to_fp32(monkeypatch, minilm_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """A default bf16 that the guard refuses is not served: the fp32 reference is, and the log
    says so (an asked-for dtype that fails is refused, as on the GPU)."""
    monkeypatch.setattr(cpu, "native_bf16", lambda: True)

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise FidelityError("fidelity probe 'short-1x16': cosine 0.5 ... refusing to serve")

    monkeypatch.setattr(engine_module, "engine_fidelity", refuse)
    with caplog.at_level(logging.WARNING, logger="embedserve.engine.engine"):
        engine = Engine.from_folder(minilm_path, device="cpu")
    assert engine.dtype == torch.float32 and engine.fidelity_cosine is None
    assert "serving float32, the reference, instead" in caplog.text
    fp32 = Engine.from_folder(minilm_path, device="cpu", dtype="float32")
    np.testing.assert_array_equal(engine.step(BATCH).wait(), fp32.step(BATCH).wait())
    with pytest.raises(FidelityError):
        Engine.from_folder(minilm_path, device="cpu", dtype="bfloat16", fidelity=True)
