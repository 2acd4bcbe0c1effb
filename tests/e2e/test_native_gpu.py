"""`serve`'s native default on a GPU with two models (an engine, CUDA graphs and a Tulip queue
each, in one process): both checked to fit and stating their memory, each request answered by
the model it names, concurrently, equal to that model in process.

Run on the GPU machine: `PYTHONPATH=src python3 -m pytest -q -m gpu tests/e2e/test_native_gpu.py`
(MiniLM: `$EMBEDSERVE_MINILM`, a float16 copy carried there, or the bundled one)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.conftest import Proc

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

TEXTS = [f"query {i}: " + "the tide comes in over the sand " * (1 + i % 7) for i in range(64)]


@pytest.fixture(scope="module")
def two(minilm_folder: Path) -> Iterator[tuple[str, Proc]]:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    proc = Proc("serve", "--model", f"a={minilm_folder}", "--model", f"b={minilm_folder}",
                "--device", "cuda", "--port", "0")  # fmt: skip
    try:
        yield proc.wait_for(r"embedserve: serving a, b at (\S+)", timeout=300).group(1), proc
    finally:
        proc.stop()


def _embed(url: str, model: str, text: str) -> list[float]:
    body = json.dumps({"model": model, "input": text}).encode()
    request = urllib.request.Request(
        url + "/v1/embeddings", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            answer = json.loads(reply.read())
    except urllib.error.HTTPError as e:  # what the server said, for the failure's message
        raise AssertionError(f"{model}: {e.code} {e.read()[:500]!r}") from None
    assert answer["model"] == model
    return list(answer["data"][0]["embedding"])


def test_two_models_on_one_gpu_each_answer_their_own_requests(
    two: tuple[str, Proc], minilm_folder: Path
) -> None:
    from embedserve import Embedder

    url, proc = two
    assert "native front: a: plain embeddings answered natively" in "\n".join(proc.lines)
    memory = [line for line in proc.lines if "embedserve server: memory on cuda" in line]
    assert len(memory) == 2, proc.lines  # each engine stated its memory (the second checked)
    # each its own share of the process's reserved memory: the same model, about the same
    # workspace (the second once stated both engines' together)
    spaces = [float(re.search(r"workspace ([\d.]+) GiB", line).group(1)) for line in memory]  # type: ignore[union-attr]
    assert spaces[1] <= 1.5 * spaces[0] + 0.05, memory
    calls = [(("a", "b")[i % 2], text) for i, text in enumerate(TEXTS * 4)]
    with ThreadPoolExecutor(16) as pool:
        try:
            got = list(pool.map(lambda call: _embed(url, *call), calls))
        except AssertionError as e:
            raise AssertionError(f"{e}; the server said: {proc.lines[-20:]}") from None
    want = Embedder(minilm_folder, device="cuda").encode(TEXTS)
    for i, row in enumerate(got):
        expected = want[i % len(TEXTS)]
        cosine = float(np.dot(row, expected) / np.linalg.norm(row) / np.linalg.norm(expected))
        assert cosine >= 0.999, (i, calls[i][0], cosine)
