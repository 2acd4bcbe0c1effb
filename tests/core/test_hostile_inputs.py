"""Hostile inputs to the request core cost what the tokens they need cost, not what they weigh
(issue 24): measured in a fresh process, so the memory figures are the request's own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Prepares `input` (a 14 MB string, under the gateway's 16 MiB body limit) with each truncation
# rule and prints the CPU seconds and resident memory around it.
PROBE = r"""
import json, resource, sys, time
from pathlib import Path
from embedserve.core.inputs import InputOptions, InputPreparer
from embedserve.core.tokenization import TextTokenizer
from embedserve.errors import InputError, InputTooLong
from embedserve.loading.spec import read_model_spec

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20

folder = Path(sys.argv[1])
spec = read_model_spec(folder)
inputs = InputPreparer(spec, TextTokenizer(folder / "tokenizer.json", spec.max_seq_length))
inputs.prepare("warm up the tokenizer " * 50)
text = ("lorem ipsum dolor sit amet " * 600_000)[:14_000_000]
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

before, out = rss_mb(), {"peak_before": peak_mb()}
for truncate in (False, "end", "start"):
    start = time.process_time()
    try:
        out[str(truncate)] = len(inputs.prepare(text, InputOptions("query: ", truncate)).seqs[0])
    except InputTooLong as e:
        out[str(truncate)] = e.code
    out["cpu_" + str(truncate)] = time.process_time() - start
blob = ("0123456789abcdef" * 900_000)[:14_000_000]  # one "word": no place to cut
for truncate in (False, "end", "start"):
    start = time.process_time()
    try:
        inputs.prepare(blob, InputOptions("", truncate))
        out["blob_" + str(truncate)] = "embedded"
    except InputError as e:
        out["blob_" + str(truncate)] = e.code
    out["cpu_blob_" + str(truncate)] = time.process_time() - start
start = time.process_time()
try:
    inputs.plan_documents([[text[:7_000_000], text[7_000_000:]]])
except InputError as e:
    out["document"] = e.code
out["cpu_document"] = time.process_time() - start
del blob
out["rss_before"], out["rss_after"] = before, rss_mb()
out["peak"] = peak_mb()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe(minilm_path: Path) -> dict[str, float | str | int]:
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(minilm_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_a_14_mb_string_gets_its_400_from_a_piece_of_it(probe: dict) -> None:
    assert probe["False"] == "context_length_exceeded"
    assert probe["cpu_False"] <= 0.1  # tokenized whole: 17 s


def test_truncating_a_14_mb_string_costs_a_piece_of_it(probe: dict) -> None:
    assert probe["end"] == probe["start"] == 256
    assert probe["cpu_end"] <= 0.1 and probe["cpu_start"] <= 0.1


def test_memory_is_back_after_a_14_mb_string(probe: dict) -> None:
    # tokenized whole: a 2 GB peak, and a gigabyte kept
    assert probe["rss_after"] <= 1.1 * probe["rss_before"], probe
    assert probe["peak"] <= max(probe["peak_before"], probe["rss_before"] + 100), probe


def test_a_14_mb_run_of_word_characters_is_refused_from_a_bounded_piece(probe: dict) -> None:
    """A hex or base64 blob has no place to cut: it was tokenized whole, 20-29 s a request."""
    for truncate in ("False", "end", "start"):
        assert probe["blob_" + truncate] == "unsplittable_text", probe
        assert probe["cpu_blob_" + truncate] <= 0.5, probe


def test_a_14_mb_contextualized_document_is_refused_from_a_piece_of_it(probe: dict) -> None:
    """It was tokenized whole first: 22.4 s."""
    assert probe["document"] == "context_length_exceeded" and probe["cpu_document"] <= 0.1, probe
