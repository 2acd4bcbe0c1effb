"""Every documentation page that a message or a page names exists: the paths to `.md` files in
the code's messages, comments and docstrings (src/, tests/, benchmarks/, scripts/, .ci/run), in
the README and the docs, and the relative Markdown links between pages (a skip message pointed
at docs/retrieval.md, which never existed; .ci/run cited ARCHITECTURE.md, which is not in the
repository)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS = {p.name for p in PAGES}
SOURCES = [
    path
    for top in ("src", "tests", "benchmarks")
    for path in sorted((ROOT / top).rglob("*.py"))
    # not a hidden folder's (benchmarks/peers/.bundle: the peers' own packages, built here)
    if not any(part.startswith(".") for part in path.relative_to(ROOT).parts)
] + [*sorted((ROOT / "scripts").glob("*")), ROOT / ".ci" / "run"]
SOURCES.remove(Path(__file__).resolve())  # it names missing pages on purpose, below
# a page named from the repository root (`docs/models.md`, `README.md`, `benchmarks/README.md`)
NAMED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
# a Markdown link to a page, relative to the page it is in: `[text](models.md#anchor)`
LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")
# pages of other projects or of a machine, named as such, not files of this repository
ELSEWHERE = {"CHANGELOG.md", "KINDS.md", "MACHINES.md"}
RESULTS = {p.name for p in (ROOT / "benchmarks" / "results").rglob("*.md")}


def named_pages(text: str) -> set[str]:
    return {
        m
        for m in NAMED.findall(text)
        if Path(m).name not in ELSEWHERE and not m.startswith("-") and "://" not in m
    }


def _exists(name: str, path: Path) -> bool:
    """From the root, beside the page that names it, under docs/ (a message names a page as
    `serving.md`), or a results table named by its file name."""
    bases = (ROOT, path.parent, ROOT / "docs")
    return any((base / name).exists() for base in bases) or name in RESULTS


def missing_from(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    test_data = path.is_relative_to(ROOT / "tests")
    out = []
    for name in named_pages(text):
        if test_data and "/" not in name and not name[0].isupper() and name not in DOCS:
            continue  # a test's own file (`b.md` in a folder it makes), not a page
        if not _exists(name, path):
            out.append(name)
    for link in LINK.findall(text):
        if not (path.parent / link).exists():
            out.append(link)
    return sorted(set(out))


@pytest.mark.parametrize("path", PAGES + SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_named_exists(path: Path) -> None:
    assert not missing_from(path), f"{path.relative_to(ROOT)} names pages that do not exist"


def test_the_checker_sees_a_missing_page(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    page.write_text("see docs/retrieval.md, [models](model.md#pooling), ARCHITECTURE.md, README.md")
    assert missing_from(page) == ["ARCHITECTURE.md", "docs/retrieval.md", "model.md"]
    assert named_pages("a `https://example.org/README.md` page") == set()
