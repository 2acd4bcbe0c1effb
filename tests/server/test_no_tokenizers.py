"""The server never tokenizes: its modules import without the `tokenizers` library.

It reaches the request core only through `core.head` (the head) and `core.budget`; a path
through `core.inputs` would pull in `chunking` and `tokenization`, which need `tokenizers`.
"""

from __future__ import annotations

import subprocess
import sys

# A finder first on sys.meta_path refuses `tokenizers` as if it were not installed.
BLOCKED = """
import importlib.abc, sys

class NoTokenizers(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tokenizers" or name.startswith("tokenizers."):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None

sys.meta_path.insert(0, NoTokenizers())
"""


def run_blocked(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED + code], capture_output=True, text=True, timeout=120
    )


def test_the_blocker_refuses_tokenizers() -> None:
    run = run_blocked("import embedserve.core.tokenization")
    assert run.returncode != 0
    assert "blocked by the test" in run.stderr


def test_the_server_modules_import_without_tokenizers() -> None:
    run = run_blocked(
        "import embedserve.server.scheduler, embedserve.server.service, embedserve.server.local\n"
        "import embedserve.contract.codec\n"
        "print(sorted(m for m in sys.modules if m.startswith('embedserve.core')))"
    )
    assert run.returncode == 0, run.stderr
    assert (
        run.stdout.strip()
        == "['embedserve.core', 'embedserve.core.budget', 'embedserve.core.head']"
    )
