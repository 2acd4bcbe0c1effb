"""The native request path's prototype beside the Python path it replaces (issue 55, "measure
first"), both in front of the null engine, in one run.

- python: the real `embedserve gateway` (1 worker: uvicorn, JSON, tokenization, the hop) and the
  real server process (queue, scheduler, engine and results threads) behind it
  (`harness/null_engine.py`);
- native: `embedserve._native.Gateway` (Rust: hyper, serde, the `tokenizers` crate, the FCFS
  token-budget queue) calling the same null engine's `step()` through pyo3, one process
  (`harness/native_front.py`), its runtime on `--threads` threads.

Every server-side process is pinned to core 0 and the load generator, wrk, to core 1, so each
side's requests per core is requests over the CPU seconds its processes used in the window
(`*_cores`). Loads: short queries (3-12 words) at 1 and 16 connections, and requests of 100
passages (8-180 words, those within MiniLM's 256 tokens; base64 answers) at 4 connections; tokens counted with the model's own
tokenizer.

    PYTHONPATH=src python3 benchmarks/studies/native_path.py [--seconds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.machine import cpu_seconds, load1
from harness.servers import ROOT, harness_call, start, wait_http
from studies.null_path import NAME, start_pair

from embedserve.processes import Child, descendants

READY_NATIVE = r"native: ready on 127\.0\.0\.1:(\d+)"
LIMIT = 256  # MiniLM's tokens per text: the prototype refuses longer ones (no truncation yet)


def _tokenizer() -> Any:
    from tokenizers import Tokenizer

    from embedserve.loading.bundled import resolve_model

    tok = Tokenizer.from_file(str(resolve_model("minilm") / "tokenizer.json"))
    tok.no_padding()  # the file pads to 128: the server does not
    tok.no_truncation()
    return tok


def bodies() -> dict[str, list[bytes]]:
    queries = [json.dumps({"input": q, "model": NAME}).encode() for q in corpus.queries(256)]
    candidates = corpus.passages(1200, max_words=180)
    lengths = [len(e.ids) for e in _tokenizer().encode_batch(candidates)]
    passages = [p for p, n in zip(candidates, lengths, strict=True) if n <= LIMIT][:800]
    bulk = [
        json.dumps(
            {"input": passages[i : i + 100], "model": NAME, "encoding_format": "base64"}
        ).encode()
        for i in range(0, 800, 100)
    ]
    return {"queries": queries, "passages": bulk}


def mean_tokens(bodies: list[bytes]) -> float:
    tok = _tokenizer()
    counts = []
    for body in bodies:
        texts = json.loads(body)["input"]
        texts = [texts] if isinstance(texts, str) else texts
        counts.append(sum(len(e.ids) for e in tok.encode_batch(texts)))
    return sum(counts) / len(counts)


def lua_script(bodies: list[bytes], folder: Path) -> Path:
    """A wrk script that posts `bodies` in turn."""
    parts = ",\n".join(f"[==[{b.decode()}]==]" for b in bodies)
    path = folder / f"post-{len(bodies)}-{abs(hash(bodies[0]))}.lua"
    path.write_text(
        f"local bodies = {{\n{parts}\n}}\nlocal i = 0\n"
        "request = function()\n  i = i % #bodies + 1\n"
        '  return wrk.format("POST", "/v1/embeddings", '
        '{["Content-Type"] = "application/json"}, bodies[i])\nend\n'
    )
    return path


def pin(pid: int, core: int) -> None:
    """Every thread of `pid` and of the processes below it onto `core`."""
    for p in {pid, *descendants(pid)}:
        subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(p)], capture_output=True)


def _ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def wrk(port: int, script: Path, connections: int, seconds: float) -> dict[str, float]:
    argv = ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency",
            "-s", str(script), f"http://127.0.0.1:{port}/v1/embeddings"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    return {
        "requests": float(re.search(r"(\d+) requests in", out).group(1)),  # type: ignore[union-attr]
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50_ms": _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1)),  # type: ignore[union-attr]
        "p99_ms": _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)),  # type: ignore[union-attr]
        "errors": float(errors.group(1)) if errors else 0.0,
        "socket_errors": 1.0 if socket_errors else 0.0,
    }


def measure(side: str, port: int, pids: list[int], loads: list[tuple[str, int, Path, float]],
            seconds: float) -> list[dict[str, Any]]:  # fmt: skip
    records = []
    for load, connections, script, tokens in loads:
        wrk(port, script, connections, 1.0)  # warm-up
        before = sum(cpu_seconds(p) for p in pids)
        start_t = time.perf_counter()
        out = wrk(port, script, connections, seconds)
        window = time.perf_counter() - start_t
        used = sum(cpu_seconds(p) for p in pids) - before
        out["server_side_cores"] = used / window
        out["requests_per_core"] = out["requests"] / used if used else 0.0
        out["tokens_per_s"] = out["requests_per_s"] * tokens
        out["tokens_per_core_s"] = out["requests_per_core"] * tokens
        for metric, value in out.items():
            records.append({
                "system": f"embedserve {side} request path (null engine)",
                "model": "all-MiniLM-L6-v2 (tokenizer and spec; no forward)",
                "weights": "none", "dtype": "none",
                "batch": 1 if load == "queries" else 100,
                "tokens": f"{tokens:.0f} per request",
                "concurrency": connections, "metric": metric, "value": round(value, 3),
                "scope": "end_to_end",
            })  # fmt: skip
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--threads", default="1", help="the native runtime's threads")
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    args = ap.parse_args()
    all_bodies = bodies()
    folder = Path(tempfile.mkdtemp(prefix="native-path-"))
    tokens = {name: mean_tokens(b) for name, b in all_bodies.items()}
    scripts = {name: lua_script(b, folder) for name, b in all_bodies.items()}
    loads = [("queries", 1, scripts["queries"], tokens["queries"]),
             ("queries", 16, scripts["queries"], tokens["queries"]),
             ("passages", 4, scripts["passages"], tokens["passages"])]  # fmt: skip
    records: list[dict[str, Any]] = []
    src = str(ROOT / "src")
    server, gateway, _, port = start_pair(src, "minilm", 1, [])
    children: list[Child] = [server, gateway]
    try:
        for c in children:
            pin(c.proc.pid, 0)
        records += measure("python", port, [c.proc.pid for c in children], loads, args.seconds)
    finally:
        for c in children:
            c.stop()
    native, ready = start(harness_call("native_front:serve_native", "minilm", "0", "null",
                                       args.threads), READY_NATIVE)  # fmt: skip
    try:
        port = int(ready.group(1))
        wait_http(native, port)
        pin(native.proc.pid, 0)
        records += measure("native", port, [native.proc.pid], loads, args.seconds)
    finally:
        native.stop()
    notes = (
        f"Null engine: every sequence answered at once with a fixed vector. Server side pinned "
        f"to core 0, wrk 4.1 (one thread) to core 1 of {os.cpu_count()}. *_per_core: over the CPU "
        f"seconds of the server side's processes in the window (python: gateway worker and "
        f"server process; native: its one process). Load average at the end {load1():.2f}."
    )
    _, table = report.write(
        "native-path", report.cpu_hardware(), "cpu2" if os.cpu_count() == 2 else "cpu",
        records, report.versions("uvicorn", "httptools", "grpcio", "orjson", "tokenizers"),
        notes, args.out,
    )  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
