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


def test_a_forbidden_import_breaks_its_rule(tmp_path: Path) -> None:
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    budget = src / "embedserve" / "core" / "budget.py"
    budget.write_text(budget.read_text() + "\nimport torch  # forbidden in the request core\n")

    out = _lint(tmp_path)

    assert out.returncode != 0, out.stdout
    # The analysed package is the copy: the rule names the very module and line we broke.
    broken = "the request core and model loading import neither torch nor grpc BROKEN"
    assert broken in out.stdout
    assert "embedserve.core is not allowed to import torch" in out.stdout
    assert "embedserve.core.budget -> torch" in out.stdout


def test_the_devtools_rule_covers_every_module_but_the_cli() -> None:
    """The rule lists its sources (import-linter has no "all but"): a new module must join it."""
    (devtools,) = [c for c in _contracts() if c["forbidden_modules"] == ["embedserve.devtools"]]
    package = ROOT / "src" / "embedserve"
    modules = {
        f"embedserve.{p.stem}"
        for p in package.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    assert set(devtools["source_modules"]) == modules - {  # type: ignore[arg-type]
        "embedserve.cli",
        "embedserve.devtools",
    }
