"""Starting and stopping the processes a benchmark measures: `embedserve` commands, servers that
live in the harness (started as `python -c`), and what they run with."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from embedserve.processes import Child

from .http_calls import post_json

BENCH = Path(__file__).resolve().parents[1]  # benchmarks/
ROOT = BENCH.parent
CLI = [sys.executable, "-m", "embedserve.cli.main"]
SERVING = r"serving \S+ at http://127\.0\.0\.1:(\d+)"  # `embedserve serve`'s ready line


def start(argv: list[str], ready: str, timeout: float = 600) -> tuple[Child, re.Match[str]]:
    """A started process (its own session, output kept) and its ready line's match."""
    child = Child(argv)
    return child, child.wait_for(ready, timeout=timeout)


def serve(*flags: str) -> tuple[Child, int]:
    """`embedserve serve --port 0 FLAGS` started and ready: the process and its HTTP port."""
    child, ready = start([*CLI, "serve", "--port", "0", *flags], SERVING)
    return child, int(ready.group(1))


def harness_call(target: str, *args: str) -> list[str]:
    """The argv of a Python process that runs `harness.<module>:<function>(*args)`: how a
    benchmark starts a server the harness defines (no script runs another script)."""
    module, function = target.split(":")
    code = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r}); "
        f"from harness.{module} import {function}; {function}(*sys.argv[1:])"
    )
    return [sys.executable, "-c", code, *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(child: Child, port: int, timeout: float = 300.0) -> None:
    """Until `POST /v1/embeddings` answers 200 (the child's output on failure)."""
    deadline = time.monotonic() + timeout
    body = json.dumps({"input": "ready?", "model": "minilm"}).encode()
    while True:
        if child.proc.poll() is not None:
            raise RuntimeError(f"{child.name} exited:\n" + "".join(child.lines[-40:]))
        try:
            post_json(port, body)
            return
        except (OSError, RuntimeError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{child.name}: no answer:\n" + "".join(child.lines[-40:])
                ) from None
            time.sleep(0.5)


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """os.environ with `values` set (None: removed) while children are started."""
    saved = {k: os.environ.get(k) for k in values}
    _apply(values)
    try:
        yield
    finally:
        _apply(saved)


def _apply(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def head_src() -> tuple[Path, str]:
    """HEAD's src/ exported into a temporary folder (and HEAD's short hash): what is measured
    when another engineer's uncommitted edits must not be."""
    out = Path(tempfile.mkdtemp(prefix="bench-head-"))
    tar = subprocess.run(
        ["git", "archive", "HEAD", "src"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(out, filter="data")
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return out, sha


def venv_versions(python: Path, *packages: str) -> dict[str, str]:
    """Package versions as another Python (a peer's virtualenv) sees them."""
    code = (
        "import json, importlib.metadata as m, sys\n"
        "out = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try: out[p] = m.version(p)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([str(python), "-c", code, *packages], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def stage_sums(metrics_port: int) -> dict[str, tuple[float, float]]:
    """The server's `embedserve_server_stage_seconds` per stage: (sum, count)."""
    name = "embedserve_server_stage_seconds"
    samples = metric_samples(f"http://127.0.0.1:{metrics_port}/metrics", {name})
    out: dict[str, list[float]] = {}
    for (sample, labels), value in samples.items():
        pair = out.setdefault(dict(labels)["stage"], [0.0, 0.0])
        if sample == f"{name}_sum":
            pair[0] = value
        elif sample == f"{name}_count":
            pair[1] = value
    return {stage: (total, count) for stage, (total, count) in out.items()}


def metric_samples(
    url: str, families: set[str]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of the named metric families at a Prometheus endpoint:
    {(sample name, sorted labels): value}, e.g. a histogram's _bucket / _sum / _count."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.name in families
        for s in family.samples
    }
