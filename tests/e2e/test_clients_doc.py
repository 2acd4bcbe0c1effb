"""The client snippets of docs/clients.md that are marked tested run as written, against a real
`embedserve serve` (only the base URL is filled in)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients.md"


def tested_blocks() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    return dict(re.findall(r"<!-- tested: (\w+) -->\n```python\n(.*?)```", text, flags=re.S))


def test_the_openai_snippet_runs_as_written(served: str) -> None:
    blocks = tested_blocks()
    assert "openai" in blocks, "docs/clients.md lost its tested openai block"
    exec(compile(blocks["openai"], str(DOC), "exec"), {"BASE_URL": f"{served}/v1"})
