"""A text's vector does not depend on what it was batched with (faults IV), on every CPU path:
each float32 executor (ONNX Runtime, packed, eager) gives a text alone and beside short or long
companions the same vector within float32 rounding; bf16 within cosine 0.9999. Duplicate
collapsing and result caching rely on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedserve.embedder import Embedder
from embedserve.engine import cpu
from embedserve.engine.fidelity import row_cosines

TEXT = "how do vector databases rank the documents they return?"
COMPANIONS = [
    [],
    ["ok"],
    ["a much longer passage about the history of search engines and inverted indexes " * 3],
    [f"query {i} about topic {i % 5}" for i in range(30)],
]


@pytest.fixture(autouse=True)
def _float32_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)


def _rows(embedder: Embedder) -> list[np.ndarray]:
    """TEXT's vector beside each set of companions, TEXT placed in the middle."""
    out = []
    for others in COMPANIONS:
        half = len(others) // 2
        batch = [*others[:half], TEXT, *others[half:]]
        out.append(embedder.encode(batch)[half])
    return out


@pytest.mark.parametrize("path", ["onnx", "packed", "eager"])
def test_float32_paths_give_a_text_the_same_vector_in_any_batch(
    path: str, minilm_path: Path
) -> None:
    if path == "onnx":
        pytest.importorskip("onnxruntime")
    rows = _rows(Embedder(minilm_path, device="cpu", cpu_path=path))
    for row in rows[1:]:
        np.testing.assert_allclose(row, rows[0], atol=2e-6)


def test_bf16_gives_a_text_the_same_vector_within_the_guard(minilm_path: Path) -> None:
    rows = _rows(Embedder(minilm_path, device="cpu", dtype="bfloat16"))
    assert row_cosines(np.stack(rows[1:]), np.stack([rows[0]] * 3)).min() >= 0.9999
