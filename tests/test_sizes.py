"""The size rules of src/ hold: no module over 450 lines, no function over 90 lines
(scripts/sizes.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_or_function_over_its_limit() -> None:
    spec = importlib.util.spec_from_file_location("sizes", ROOT / "scripts" / "sizes.py")
    assert spec is not None and spec.loader is not None
    sizes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sizes)
    found, _, _ = sizes.offenders(ROOT / "src" / "embedserve")
    assert found == []
