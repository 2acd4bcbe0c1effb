"""The native request path (`embedserve serve --native`) beside the Python path it replaces
(issue 55), both in front of the null engine, in one run.

- python: the real `embedserve gateway` (1 worker: uvicorn, JSON, tokenization, the hop) and the
  real server process (queue, scheduler, engine and results threads) behind it
  (`harness/null_engine.py`);
- front (null engine only): the same server process behind the native front, `embedserve
  gateway`'s default (Ivy's calls over the server's unix socket: what a host of several GPUs
  runs, a server process per engine);
- native: `embedserve serve --native` (Rust: hyper, serde, the `tokenizers` crate, Tulip's FCFS
  token-budget queue) calling the same null engine's `step()` through pyo3, one process
  (`harness/null_engine.py`'s `serve_native_null`).

On a 2-core machine every server-side process is pinned to core 0 and the load generator, wrk,
to core 1; elsewhere nothing is pinned. Each side's requests per core is requests over the CPU
seconds its processes used in the window (`server_side_cores`). Loads: short queries (3-12
words) at each of `--connections`, and requests of 100 passages (8-180 words, those within
MiniLM's 256 tokens; base64 answers) at 4 connections; tokens counted with the model's own
tokenizer. `--floor BIN` then measures the short queries against `benchmarks/floor` (hyper
alone, a fixed answer of the native answer's size: what HTTP/1 and the kernel cost, the floor
under the native path). `--engine real` puts the real engine behind both instead (`embedserve serve
--device D`, without and with `--native`), and times `Embedder.encode` in process as the floor.

    PYTHONPATH=src python3 benchmarks/studies/native_path.py [--seconds 5] [--out DIR]
        [--model FOLDER] [--connections 1,16,64] [--engine null|real --device cuda] [--floor BIN]
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
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.machine import cpu_seconds, load1
from harness.servers import CLI, ROOT, SERVING, free_port, harness_call, start, wait_http
from studies.null_path import NAME, start_pair

from embedserve.processes import Child, descendants

LIMIT = 256  # MiniLM's tokens per text: longer ones would be cut (the Python front's rule)


MODEL = "minilm"  # `--model`: the folder both sides serve (as NAME)


def _tokenizer() -> Any:
    from tokenizers import Tokenizer

    from embedserve.loading.bundled import resolve_model

    tok = Tokenizer.from_file(str(resolve_model(MODEL) / "tokenizer.json"))
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


PIN = True  # null engine on 2 cores only: a real engine's threads take both cores, as users run it


def pin(pid: int, core: int) -> None:
    """Every thread of `pid` and of the processes below it onto `core` (2-core machines only)."""
    if os.cpu_count() != 2 or not PIN:
        return
    for p in {pid, *descendants(pid)}:
        subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(p)], capture_output=True)


def _ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


WRK = "wrk"  # `--wrk`: its path


def wrk(port: int, script: Path, connections: int, seconds: float) -> dict[str, float]:
    threads = 1 if os.cpu_count() == 2 else min(4, connections)
    pinned = ["taskset", "-c", "1"] if os.cpu_count() == 2 and PIN else []
    # --timeout: wrk's own 2 s drops a 100-passage request to the real engine on a 2-core CPU
    argv = [*pinned, WRK, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s",
            "--latency", "--timeout", "60s", "-s", str(script),
            f"http://127.0.0.1:{port}/v1/embeddings"]  # fmt: skip
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
            seconds: float, engine: str, bulk_seconds: float,
            system: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    records = []
    for load, connections, script, tokens in loads:
        wrk(port, script, connections, 1.0)  # warm-up
        before = sum(cpu_seconds(p) for p in pids)
        start_t = time.perf_counter()
        out = wrk(port, script, connections, bulk_seconds if load == "passages" else seconds)
        window = time.perf_counter() - start_t
        used = sum(cpu_seconds(p) for p in pids) - before
        out["server_side_cores"] = used / window
        out["requests_per_core"] = out["requests"] / used if used else 0.0
        out["tokens_per_s"] = out["requests_per_s"] * tokens
        out["tokens_per_core_s"] = out["requests_per_core"] * tokens
        for metric, value in out.items():
            records.append({
                "system": system or f"embedserve {side} request path ({engine} engine)",
                "model": "all-MiniLM-L6-v2" + (" (tokenizer and spec; no forward)"
                                               if engine == "null" else ""),
                "weights": "none" if engine == "null" else "real", "dtype": "none"
                if engine == "null" else "engine default",
                "batch": 1 if load == "queries" else 100,
                "tokens": f"{tokens:.0f} per request",
                "concurrency": connections, "metric": metric, "value": round(value, 3),
                "scope": "end_to_end",
            })  # fmt: skip
    return records


def in_process(device: str, count: int = 400) -> list[dict[str, Any]]:
    """One short query at a time through `Embedder.encode` in this process: the floor HTTP adds
    to; p50 / p99 of `count` after 50 warm-up calls."""
    import statistics

    from embedserve.embedder import Embedder

    embedder = Embedder(MODEL, device=device)
    queries = corpus.queries(256)
    times = []
    for i in range(50 + count):
        start = time.perf_counter()
        embedder.encode([queries[i % len(queries)]])
        times.append((time.perf_counter() - start) * 1e3)
    times = sorted(times[50:])
    base = {"system": "embedserve in process (Embedder.encode)", "model": "all-MiniLM-L6-v2",
            "weights": "real", "dtype": "engine default", "batch": 1, "tokens": "short query",
            "concurrency": 1, "scope": "in_process"}  # fmt: skip
    return [{**base, "metric": "p50_ms", "value": round(statistics.median(times), 3)},
            {**base, "metric": "p99_ms", "value": round(times[int(0.99 * len(times))], 3)}]  # fmt: skip


def floor_side(binary: str, answer_bytes: int, loads: list[tuple[str, int, Path, float]],
               seconds: float) -> list[dict[str, Any]]:  # fmt: skip
    """The floor under the short queries: `benchmarks/floor` (hyper with Ivy's runtime, socket
    options and headers) answering each with a fixed body of the native answer's size and no
    other work: what HTTP/1 and the kernel's loopback cost a request on this machine."""
    port = free_port()
    child, _ = start([binary, str(port), str(answer_bytes)], r"http-floor: listening on (\d+)")
    try:
        pin(child.proc.pid, 0)
        short = [load for load in loads if load[0] == "queries"]
        system = f"the floor (hyper, a fixed {answer_bytes}-byte answer, no work)"
        return measure("floor", port, [child.proc.pid], short, seconds, "no", seconds, system)
    finally:
        child.stop()


def python_side(args: argparse.Namespace, front: bool = False) -> tuple[list[Child], int]:
    """The Python path: the null server and a gateway, or `embedserve serve` with the engine.
    `front`: the null server behind the native front instead (`embedserve gateway`'s default:
    Ivy's calls over the server's unix socket)."""
    if args.engine == "null":
        server, gateway, _, port = start_pair(str(ROOT / "src"), MODEL, 1, [], native=front)
        return [server, gateway], port
    child, ready = start([*CLI, "serve", "--no-native", "--port", "0", "--model",
                          f"{NAME}={MODEL}", "--device", args.device, *_replicas(args)],
                         SERVING)  # fmt: skip
    port = int(ready.group(1))
    wait_http(child, port)
    return [child], port


def _replicas(args: argparse.Namespace) -> list[str]:
    """`--replicas N` for both sides' `serve` when asked (server processes behind the native
    front, or behind the Python gateway)."""
    return ["--replicas", str(args.replicas)] if args.replicas else []


def main() -> None:
    global MODEL, WRK, PIN
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--bulk-seconds", type=float, default=None,
                    help="the 100-passage load's window (default --seconds): a CPU engine "
                         "answers a dozen such requests in 5 s")  # fmt: skip
    ap.add_argument("--model", default="minilm", help="a folder, or minilm (bundled)")
    ap.add_argument("--connections", default="1,16", help="of short queries, e.g. 1,16,64")
    ap.add_argument("--engine", choices=("null", "real"), default="null")
    ap.add_argument("--device", default="cpu", help="the real engine's device")
    ap.add_argument("--replicas", type=int, default=0, help="the real engine's server "
                    "processes (both sides' `serve --replicas N`); 0: an engine in process")  # fmt: skip
    ap.add_argument("--wrk", default="wrk", help="wrk's path")
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    ap.add_argument("--table", action="store_true", help="print every record, not the summary")
    ap.add_argument("--floor", default=None, help="benchmarks/floor's binary: hyper alone, after "
                    "the native side (cargo build --release in benchmarks/floor)")  # fmt: skip
    args = ap.parse_args()
    MODEL, WRK, PIN = args.model, args.wrk, args.engine == "null"
    bulk_seconds = args.seconds if args.bulk_seconds is None else args.bulk_seconds
    all_bodies = bodies()
    folder = Path(tempfile.mkdtemp(prefix="native-path-"))
    tokens = {name: mean_tokens(b) for name, b in all_bodies.items()}
    scripts = {name: lua_script(b, folder) for name, b in all_bodies.items()}
    loads = [("queries", int(c), scripts["queries"], tokens["queries"])
             for c in args.connections.split(",")]  # fmt: skip
    loads.append(("passages", 4, scripts["passages"], tokens["passages"]))
    records: list[dict[str, Any]] = in_process(args.device) if args.engine == "real" else []
    sides = ["python", "front"] if args.engine == "null" else ["python"]
    for side in sides:
        children, port = python_side(args, front=side == "front")
        try:
            for c in children:
                pin(c.proc.pid, 0)
            pids = [c.proc.pid for c in children]
            system = (
                "embedserve front (the native front and the Python server process, null engine)"
                if side == "front" else None
            )  # fmt: skip
            records += measure(side, port, pids, loads, args.seconds, args.engine, bulk_seconds,
                               system)  # fmt: skip
        finally:
            for c in children:
                c.stop()
    if args.engine == "null":
        argv = harness_call("null_engine:serve_native_null", MODEL, "0", NAME)
    else:
        argv = [*CLI, "serve", "--native", "--port", "0", "--model", f"{NAME}={MODEL}",
                "--device", args.device, *_replicas(args)]  # fmt: skip
    native, ready = start(argv, SERVING)
    try:
        port = int(ready.group(1))
        wait_http(native, port)
        pin(native.proc.pid, 0)
        records += measure(
            "native", port, [native.proc.pid], loads, args.seconds, args.engine, bulk_seconds
        )
        if any(r["metric"] == "errors" and r["value"] for r in records):
            print("".join(native.lines[-20:]), file=sys.stderr)  # what the failures said
        answer = urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/embeddings", data=all_bodies["queries"][0],
            headers={"Content-Type": "application/json"})).read()  # fmt: skip
    finally:
        native.stop()
    if args.floor:
        records += floor_side(args.floor, len(answer), loads, args.seconds)
    notes = (
        f"{'Null engine: every sequence answered at once with a fixed vector' if args.engine == 'null' else f'The real engine on {args.device}'}. "
        f"{'Server side pinned to core 0, wrk 4.1 (one thread) to core 1' if os.cpu_count() == 2 and PIN else 'Nothing pinned'} "
        f"of {os.cpu_count()} cores. Windows: {args.seconds:g} s, the 100-passage load "
        f"{bulk_seconds:g} s. *_per_core: over the CPU seconds of the server side's "
        f"processes in the window (python: gateway and server processes; native: its one "
        f"process). Load average at the end {load1():.2f}."
    )
    if args.device.startswith("cuda"):
        import torch

        notes += f" GPU: {torch.cuda.get_device_name()}."
    slug = "cpu2" if os.cpu_count() == 2 else f"host{os.cpu_count()}"
    if args.engine == "real":
        slug += f"-{args.device.split(':')[0]}"
    if args.replicas:
        slug += f"-replicas{args.replicas}"
        notes += f" Both sides: `serve --replicas {args.replicas}` (server processes)."
    _, table = report.write(
        "native-path", report.cpu_hardware(), slug,
        records, report.versions("uvicorn", "httptools", "grpcio", "orjson", "tokenizers"),
        notes, args.out,
    )  # fmt: skip
    print(table if args.table else summary(records))


def summary(records: list[dict[str, Any]]) -> str:
    """A short table: each side and load's rate, latency and rate per core."""
    rows: dict[tuple[str, int, int], dict[str, float]] = {}
    floor = {r["metric"]: r["value"] for r in records if r["scope"] == "in_process"}
    for r in records:
        if r["scope"] == "in_process":
            continue
        side = r["system"].split()[1]
        rows.setdefault((side, r["batch"], r["concurrency"]), {})[r["metric"]] = r["value"]
    lines = ["| side | batch | conns | req/s | p50 ms | p99 ms | req/s per core | tokens/s per core | errors |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (side, batch, conns), m in rows.items():
        lines.append(f"| {side} | {batch} | {conns} | {m['requests_per_s']:,.0f} | {m['p50_ms']} "
                     f"| {m['p99_ms']} | {m['requests_per_core']:,.0f} "
                     f"| {m['tokens_per_core_s']:,.0f} | {m['errors']:.0f} |")  # fmt: skip
    if floor:
        lines.append(f"\nin process (Embedder.encode, one short query): p50 {floor['p50_ms']} ms, "
                     f"p99 {floor['p99_ms']} ms")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
