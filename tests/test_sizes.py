"""The size rules of src/ hold (scripts/sizes.py), and they are the rules docs/architecture.md
states."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _sizes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sizes", ROOT / "scripts" / "sizes.py")
    assert spec is not None and spec.loader is not None
    sizes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sizes)
    return sizes


def test_no_module_or_function_over_its_limit() -> None:
    found, _, _ = _sizes().offenders(ROOT / "src" / "embedserve")
    assert found == []


def test_the_script_checks_the_rule_the_map_states() -> None:
    text = " ".join((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split())
    stated = re.search(r"no module over (\d+) lines, no function over (\d+)", text)
    assert stated, "docs/architecture.md states no size rule"
    sizes = _sizes()
    assert (int(stated[1]), int(stated[2])) == (sizes.MAX_MODULE_LINES, sizes.MAX_FUNCTION_LINES)
    script_doc = " ".join((sizes.__doc__ or "").split())
    assert f"no module over {sizes.MAX_MODULE_LINES} lines" in script_doc
    assert f"no function over {sizes.MAX_FUNCTION_LINES} lines" in script_doc
