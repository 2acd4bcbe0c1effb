"""The layer rules of pyproject.toml's [tool.importlinter], checked by import-linter.

One test runs `lint-imports` on the tree as it is; one proves a rule bites, on a copy of `src/`
with a forbidden import added (a checker that passes everything passes this tree too).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"

# The package has no `__main__`; this is the body of its `lint-imports` console script, run by
# this interpreter so that the test needs no script on PATH.
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """Runs lint-imports on `root/src/embedserve` with the contracts of `root/pyproject.toml`.

    The config is found by the working directory (its `--config` option changed form across
    releases); PYTHONPATH puts `root/src` ahead of the installed package, so grimp reads it.
    """
    env = dict(os.environ, PYTHONPATH=str(root / "src"))
    return subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _contracts() -> list[dict[str, object]]:
    with PYPROJECT.open("rb") as f:
        contracts: list[dict[str, object]] = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return contracts


def test_the_tree_keeps_every_import_rule() -> None:
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in out.stdout


def _copy_with(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the tree whose `module` (a path under src/embedserve) ends with `line`."""
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    path = src / "embedserve" / module
    path.write_text((path.read_text() if path.exists() else "") + f"\n{line}\n")
    return tmp_path


def test_a_forbidden_import_breaks_its_rule(tmp_path: Path) -> None:
    out = _lint(_copy_with(tmp_path, "core/budget.py", "import torch  # forbidden in the core"))

    assert out.returncode != 0, out.stdout
    # The analysed package is the copy: the rule names the very module and line we broke.
    broken = "the request core, model loading and retrieval import neither torch nor grpc BROKEN"
    assert broken in out.stdout
    assert "embedserve.core is not allowed to import torch" in out.stdout
    assert "embedserve.core.budget -> torch" in out.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    """The kind of import the layers rule was written to end: loading reaching up into the
    request core (`loading/spec.py` once took `core.head`' names)."""
    line = "from embedserve.core.head import Head  # upward"
    out = _lint(_copy_with(tmp_path, "loading/spec.py", line))

    assert out.returncode != 0, out.stdout
    assert "the layers: each package imports only the layers below it BROKEN" in out.stdout
    assert "embedserve.loading is not allowed to import embedserve.core" in out.stdout
    assert "embedserve.loading.spec -> embedserve.core.head" in out.stdout


def test_a_module_without_a_layer_breaks_the_layers(tmp_path: Path) -> None:
    """`exhaustive`: a new module of the package must be given its row."""
    out = _lint(_copy_with(tmp_path, "newcomer.py", "X = 1"))

    assert out.returncode != 0, out.stdout
    assert "the layers: each package imports only the layers below it BROKEN" in out.stdout
    assert "embedserve.newcomer" in out.stdout


def test_only_the_cli_may_import_the_devtools() -> None:
    """What the removed devtools rule said, now said by the layers: `devtools` shares its row
    with `indexing` alone, and only the CLI's row is above it."""
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    rows = [[m.strip() for m in row.split("|")] for row in layers["layers"]]  # type: ignore[attr-defined]
    (row,) = [i for i, r in enumerate(rows) if "devtools" in r]
    assert rows[:row] == [["cli"]] and rows[row] == ["indexing", "devtools"]
