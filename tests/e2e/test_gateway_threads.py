"""Each gateway worker's tokenizer pool is its share of the cores (`memory.tokenizer_threads`),
set in the workers' environment; a pool size the user set is kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from embedserve.memory import TOKENIZER_POOL, tokenizer_threads
from embedserve.processes import descendants
from tests.e2e.conftest import Proc


def _worker_pools(proc: Proc) -> list[str]:
    """RAYON_NUM_THREADS in the environment of each process under the gateway."""
    out = []
    for pid in descendants(proc.proc.pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing.spawn" not in cmdline or b"spawn_main" not in cmdline:
            continue  # the resource tracker and other helpers
        out += [e.decode().partition("=")[2] for e in env if e.startswith(b"RAYON_NUM_THREADS=")]
    return out


@pytest.mark.parametrize(("user", "expected"), [(None, None), ("3", "3")])
def test_each_worker_gets_its_share_of_the_cores_for_tokenizing(
    monkeypatch: pytest.MonkeyPatch, user: str | None, expected: str | None
) -> None:
    if user is None:
        monkeypatch.delenv(TOKENIZER_POOL, raising=False)
    else:
        monkeypatch.setenv(TOKENIZER_POOL, user)
    proc = Proc("gateway", "--no-native", "--replica", "127.0.0.1:9", "--workers", "2",
                "--port", "0")  # fmt: skip
    try:
        proc.wait_for(r"embedserve gateway: listening on")
        pools = _worker_pools(proc)
    finally:
        proc.stop()
    share = str(tokenizer_threads(os.cpu_count(), 2))
    assert pools == [expected or share] * 2


@pytest.mark.parametrize(
    ("cores", "workers", "threads"), [(16, 8, 2), (2, 1, 2), (2, 2, 1), (1, 4, 1), (None, 1, 1)]
)
def test_the_share_rule(cores: int | None, workers: int, threads: int) -> None:
    assert tokenizer_threads(cores, workers) == threads
