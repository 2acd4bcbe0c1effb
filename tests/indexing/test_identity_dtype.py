"""The index manifest records the dtype the actors run: on a CPU that multiplies bf16 natively
the engine's default is bf16, and the manifest said float32 (issue 40, item 15)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")

from embedserve.engine import cpu
from embedserve.indexing.identity import vectors_identity
from embedserve.indexing.job import IndexOptions


@pytest.mark.parametrize(("native", "expected"), [(True, "bfloat16"), (False, "float32")])
def test_the_manifest_names_the_cpus_default_dtype(
    minilm_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool, expected: str
) -> None:
    monkeypatch.setattr(cpu, "native_bf16", lambda: native)
    identity = vectors_identity(IndexOptions(model=str(minilm_path), device="cpu"), 0)
    assert identity["dtype"] == expected
    asked = IndexOptions(model=str(minilm_path), device="cpu", dtype="float32")
    assert vectors_identity(asked, 0)["dtype"] == "float32"
