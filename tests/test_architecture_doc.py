"""docs/architecture.md, the one-page map, holds to the tree: what a test can check of its claims.

Its size (one page: at most 6,000 characters), its layers (the rows of the `layers` contract in
pyproject.toml, which `lint-imports` enforces), its package list (every package and module of
`src/embedserve`, and nothing else), and every file or folder it names (they exist).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "src" / "embedserve"
MAX_CHARS = 6000


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _section(title: str) -> str:
    """The text under `## title`, up to the next heading of that level."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", _doc(), re.M | re.S)
    assert match, f"docs/architecture.md has no section '## {title}'"
    return match.group(1)


def _contracts() -> list[dict[str, object]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        contracts: list[dict[str, object]] = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return contracts


def _rows(rows: list[str]) -> list[list[str]]:
    return [[name.strip() for name in row.split("|")] for row in rows]


def test_the_map_is_one_page() -> None:
    assert len(_doc()) <= MAX_CHARS, f"{len(_doc())} characters, over {MAX_CHARS}"


def test_the_layers_it_states_are_the_contracts() -> None:
    block = re.search(r"```text\n(.*?)```", _section("Layers"), re.S)
    assert block, "the Layers section has no ```text block of rows"
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    assert layers["containers"] == ["embedserve"] and layers["exhaustive"] is True
    stated = _rows([line for line in block.group(1).splitlines() if line.strip()])
    assert stated == _rows(layers["layers"])  # type: ignore[arg-type]


def test_the_forbidden_imports_it_states_are_contracts() -> None:
    forbidden = {
        (tuple(c["source_modules"]), tuple(c["forbidden_modules"]))  # type: ignore[arg-type]
        for c in _contracts()
        if c["type"] == "forbidden"
    }
    text = " ".join(_section("Layers").split())
    assert "`core`, `loading` and `retrieval` import neither torch nor grpc" in text
    sources = ("embedserve.core", "embedserve.loading", "embedserve.retrieval")
    assert (sources, ("torch", "grpc")) in forbidden
    assert "`gateway` imports no torch and no `engine`" in text
    gateway = [f for s, f in forbidden if s == ("embedserve.gateway",)]
    assert gateway and {"torch", "embedserve.engine"} <= set(gateway[0])
    assert "`server` reaches the request core only through `core.head` and `core.budget`" in text
    (server,) = [f for s, f in forbidden if s == ("embedserve.server",)]
    core = {p.stem for p in (PACKAGE / "core").glob("*.py")} - {"__init__", "head", "budget"}
    assert {f"embedserve.core.{m}" for m in core} == set(server)


def test_the_packages_it_lists_are_the_packages() -> None:
    """Each bullet of the Packages section opens with the names it describes; together they are
    the package's modules and subpackages, each once."""
    listed: list[str] = []
    for bullet in re.findall(r"^- (.*?) —", _section("Packages"), re.M):
        listed += re.findall(r"`([\w.]+/?)`", bullet)
    names = [n.removesuffix("/").removesuffix(".py") for n in listed]
    actual = {
        p.stem if p.suffix == ".py" else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    assert sorted(names) == sorted(actual)
    for name in listed:  # a folder is written `name/`, a module `name.py`
        assert (PACKAGE / name).is_dir() if name.endswith("/") else (PACKAGE / name).is_file()


def test_every_file_it_names_exists() -> None:
    """A path in backticks (`engine/graphs.py`, `engine/kernels/`, `tests/e2e`) exists under
    src/embedserve or the repository."""
    named = set(re.findall(r"`((?:[\w.]+/)+[\w.]*)`", _doc()))
    assert len(named) > 20, named  # the table and the walk of a request name files
    missing = [n for n in sorted(named) if not (PACKAGE / n).exists() and not (ROOT / n).exists()]
    assert not missing, missing
