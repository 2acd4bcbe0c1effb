"""`serve --one-process`: the gateway and a CPU engine in one process (`cli/one_process.py`),
served over real HTTP: the same vectors as the offline API, batches of concurrent clients, bad
input refused, a worker that dies started again, SIGTERM a clean stop; flags it cannot honour
refused before anything loads."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from embedserve.embedder import Embedder
from embedserve.loading.bundled import resolve_model
from tests.e2e.conftest import Proc
from tests.e2e.test_replica_failure import call

pytestmark = pytest.mark.slow

TEXTS = [
    "vector search with embeddings",
    "a second text, somewhat longer than the first one, to pad the batch",
    "q",
]
READY = r"embedserve: serving minilm at (\S+) \(one process\)"


@pytest.fixture(scope="module")
def serving() -> Iterator[tuple[str, Proc]]:
    # fp32 asked for: held to the fp32 `minilm` fixture at 1e-5 (the CPU default is bf16)
    proc = Proc("serve", "--one-process", "--port", "0", "--device", "cpu", "--dtype", "float32",
                "--metrics-port", "0")  # fmt: skip
    try:
        yield proc.wait_for(READY).group(1), proc
    finally:
        proc.stop()


def vectors(url: str, texts: str | list[str]) -> np.ndarray:
    status, body = call(url, "POST", "/v1/embeddings", {"input": texts, "model": "minilm"})
    assert status == 200, body
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def test_vectors_are_the_offline_api_s_alone_and_in_a_batch(
    serving: tuple[str, Proc], minilm: Embedder
) -> None:
    url, proc = serving
    proc.wait_for(r"embedserve server: ready in this process \(serving minilm: ")
    want = minilm.encode(TEXTS)
    np.testing.assert_allclose(vectors(url, TEXTS), want, atol=1e-5)
    for text, row in zip(TEXTS, want, strict=True):
        np.testing.assert_allclose(vectors(url, text)[0], row, atol=1e-5)


def test_concurrent_clients_each_get_their_own_vectors(
    serving: tuple[str, Proc], minilm: Embedder
) -> None:
    url = serving[0]
    texts = [f"query number {i} about {w}" for i, w in enumerate(["cats", "ships", "tea"] * 8)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda t: vectors(url, t)[0], texts))
    np.testing.assert_allclose(np.stack(got), minilm.encode(texts), atol=1e-5)


def test_the_server_s_metrics_are_served_from_the_same_process(serving: tuple[str, Proc]) -> None:
    url, proc = serving
    metrics_url = proc.wait_for(r"embedserve server: metrics on (\S+)").group(1)
    before = _stage_count(metrics_url, "launch")
    assert call(url, "POST", "/v1/embeddings", {"input": "counted"})[0] == 200
    assert _stage_count(metrics_url, "launch") == before + 1  # one batch stepped


def _stage_count(metrics_url: str, stage: str) -> float:
    """`embedserve_server_stage_seconds_count{stage=...}`, read as a Prometheus scraper does."""
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("stage_seconds_count") and sample.labels["stage"] == stage:
                return sample.value
    raise AssertionError(f"no stage count for {stage!r}")


def test_bad_input_is_a_400_that_names_the_field(serving: tuple[str, Proc]) -> None:
    status, body = call(serving[0], "POST", "/v1/embeddings", {"input": [], "model": "minilm"})
    assert status == 400 and body["error"]["param"] == "input", body
    status, body = call(serving[0], "POST", "/v1/embeddings", {"input": 5})
    assert status == 400, body


def test_a_killed_worker_is_started_again_and_serves(serving: tuple[str, Proc]) -> None:
    url, proc = serving
    workers = [
        c for c in psutil.Process(proc.proc.pid).children() if "spawn_main" in " ".join(c.cmdline())
    ]
    assert len(workers) == 1
    os.kill(workers[0].pid, signal.SIGKILL)
    deadline = time.monotonic() + 120  # backoff, then the engine loads again
    while time.monotonic() < deadline:
        try:
            if call(url, "POST", "/v1/embeddings", {"input": "back"})[0] == 200:
                break
        except OSError:  # nobody accepting on the port yet
            pass
        time.sleep(0.5)
    else:
        raise AssertionError("the worker was not started again")
    assert proc.proc.poll() is None


def test_sigterm_stops_it_cleanly() -> None:
    proc = Proc("serve", "--one-process", "--port", "0", "--device", "cpu")
    try:
        url = proc.wait_for(READY).group(1)
        assert call(url, "POST", "/v1/embeddings", {"input": "one"})[0] == 200
        proc.signal(signal.SIGTERM)
        assert proc.proc.wait(60) == 0
        proc.wait_for(r"embedserve gateway: stopped")
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--replicas", "2"], "--replicas 2 was given"),
        (["--workers", "2"], "runs one worker"),
        (["--device", "cuda"], "serves from the CPU"),
    ],
)
def test_flags_it_cannot_honour_are_refused_before_anything_loads(
    flags: list[str], message: str
) -> None:
    argv = [sys.executable, "-m", "embedserve.cli.main", "serve", "--one-process", *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_a_model_that_cannot_load_is_said_once_and_nothing_restarts(tmp_path: Path) -> None:
    # config and tokenizer pass the checks made before the worker starts; the weights are missing
    source = resolve_model("minilm")
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(source / name, tmp_path / name)
    argv = [sys.executable, "-m", "embedserve.cli.main", "serve", "--one-process", "--port", "0"]
    done = subprocess.run([*argv, "--model", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.count(f"embedserve server: error: {tmp_path}: no weights") == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
