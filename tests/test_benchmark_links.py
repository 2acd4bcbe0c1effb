"""Every benchmark file the README and the docs point at exists: results moved into
`benchmarks/results/<suite>/` and scripts into `harness/`, `suites/`, `studies/` keep their links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a path under benchmarks/ as the docs write it: in a Markdown link, in backticks or in a command
PATH = re.compile(r"benchmarks/[A-Za-z0-9_.*/-]*[A-Za-z0-9_*/]")
# placeholders of a naming rule, not files: `<suite>`, `YYYYMMDD`
PLACEHOLDER = re.compile(r"<[^>]*>|YYYY|\bOUT\b")


def cited(text: str) -> set[str]:
    found = set()
    for line in text.splitlines():
        for m in PATH.finditer(line):
            end = m.end()
            if end < len(line) and line[end] == "<":  # `benchmarks/results/<suite>/`: a rule
                continue
            if not PLACEHOLDER.search(line[m.start() : end + 12]):
                found.add(m.group(0).rstrip("."))
    return found


def exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def test_the_docs_cite_benchmark_files() -> None:
    # the test must see what it checks: the README quotes results files
    readme = cited((ROOT / "README.md").read_text())
    assert any(p.startswith("benchmarks/results/") for p in readme), readme


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_benchmark_path_in_the_docs_exists(doc: Path) -> None:
    missing = sorted(p for p in cited(doc.read_text()) if not exists(p))
    assert not missing, f"{doc.name} cites benchmark paths that do not exist: {missing}"


# a results file named without its folder, as the docs quote figures: `latency-h200-20261129`
RESULT_NAME = re.compile(
    r"(?<![/\w-])([a-z0-9]+(?:-[a-z0-9]+)*-20\d{6}(?:-[a-z0-9]+)*(?:\.(?:json|md|txt))?)"
)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_results_file_named_in_the_docs_exists(doc: Path) -> None:
    results = [p for p in (ROOT / "benchmarks" / "results").rglob("*") if p.is_file()]
    names = {p.name for p in results} | {p.stem for p in results}
    missing = sorted(set(RESULT_NAME.findall(doc.read_text())) - names)
    assert not missing, f"{doc.name} names results files that do not exist: {missing}"


def test_the_checker_sees_a_missing_file() -> None:
    text = "see [x](benchmarks/results/latency/no-such-run.json) and `benchmarks/nope.py`"
    assert cited(text) == {"benchmarks/results/latency/no-such-run.json", "benchmarks/nope.py"}
    assert not any(exists(p) for p in cited(text))
    assert RESULT_NAME.findall("(`latency-h200-20261129`, `soak-cpu-20261201.json`)") == [
        "latency-h200-20261129",
        "soak-cpu-20261201.json",
    ]
