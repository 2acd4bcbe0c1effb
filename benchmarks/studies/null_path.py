"""The host path's ceiling (issue 38): the whole request path in front of a null engine.

A real server process (`harness/null_engine.py`: queue, scheduler, engine and results threads,
response encoding) whose engine answers every sequence at once with a fixed vector, behind a real
`embedserve gateway` (HTTP, JSON, tokenization, splitting, the hop). No model runs, so what is
measured is what the design around the model can carry at most:

- loads of client processes (closed loop, `harness/loadgen.py`): short queries at 1 and many
  clients, and 100 passages per request at 4 clients; requests/s and tokens/s, and per core of
  each side: the CPU seconds the gateway's processes and the server's process used in the window
  (so requests/s per gateway core = requests / gateway CPU seconds);
- the p50 each hop adds for one client, one short query at a time: a no-op HTTP server (the
  client's and the HTTP stack's floor), the server called directly on its unix socket with
  ready token ids (the hop and the server), and the whole path through the gateway.

Each `--tree NAME=SRC` (default: this checkout's src) gets its own server and gateway, measured in
turn, so a before/after compares trees in one run on the same drifting machine; `NAME=SRC@ARGS`
gives that tree's gateway extra flags (one tree under two settings).

    PYTHONPATH=src python3 benchmarks/studies/null_path.py [--tree new=src --tree old=/tmp/old/src]
        [--workers 1,2] [--clients 1,16] [--seconds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, loadgen, report
from harness.gateway import sequential_us
from harness.machine import CpuMeter, cpu_seconds, load1, thread_cores, thread_seconds
from harness.servers import CLI, ROOT, environment, harness_call, start, wait_http
from harness.timing import percentile

from embedserve.processes import Child

READY_SERVER = r"server: ready on 127\.0\.0\.1:(\d+)"
READY_GATEWAY = r"listening on http://127\.0\.0\.1:(\d+)"
HOP_REQUESTS = 600
NAME = "minilm"  # the served name, whatever folder --model names


def start_pair(
    src: str, model: str, workers: int, gateway_args: list[str], native: bool = False
) -> tuple[Child, Child, int, int]:
    """A null server and a gateway of `workers` (and `gateway_args`) in front of it, both from
    `src`; the model served as NAME (`bodies`). The Python gateway, or the native front when
    `native`."""
    # the tree's embedserve first; what else the path held (carried wheels) after it
    with environment(PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])):
        server, ready = start(harness_call("null_engine:serve_null", model, "0"), READY_SERVER)
        server_port = int(ready.group(1))
        gateway, ready = start(
            [*CLI, "gateway", *([] if native else ["--no-native"]), "--replica",
             f"127.0.0.1:{server_port}", "--model", f"{NAME}={model}", "--port", "0",
             "--workers", str(workers), *gateway_args],
            READY_GATEWAY,
        )  # fmt: skip
    port = int(ready.group(1))
    wait_http(gateway, port)
    return server, gateway, server_port, port


def measured_load(
    port: int, bodies: list[bytes], clients: int, seconds: float, pids: dict[str, int]
) -> dict[str, float]:
    """One closed-loop load and the cores each side used meanwhile."""

    # NOTE: the server's own process only: on a GPU host its engine's torch.compile starts a
    # pool of compile workers, whose start-up (importing torch) fell into the first load's window
    # and read as 1.1-1.6 server cores at one client (results/studies/null-path-h200host-cif-*)
    def used_by(side: str, pid: int) -> float:
        return cpu_seconds(pid, below=side != "server")

    before = {side: used_by(side, pid) for side, pid in pids.items()}
    threads = thread_seconds(pids["server"])
    meter = CpuMeter()
    out = loadgen.run(port, loadgen.split(bodies, clients), seconds).summary()
    # the server's cores by thread name: its loop, engine and results threads, and the rest
    # (gRPC's, OpenMP's) by their own names
    for name, cores in thread_cores(threads, thread_seconds(pids["server"]), seconds).items():
        if cores >= 0.01:
            out[f"server_cores_{name}"] = cores
    # the window is `seconds` of the ~(seconds + start lead) the processes were watched: the
    # sides are idle before the shared start, so their CPU seconds are the window's
    for side, pid in pids.items():
        used = used_by(side, pid) - before[side]
        out[f"{side}_cores"] = used / seconds
        out[f"requests_per_{side}_core"] = out["requests"] / used if used else 0.0
        out[f"tokens_per_{side}_core_s"] = out["tokens_per_s"] * seconds / used if used else 0.0
    out["machine_busy_cores"] = meter.busy_cores()
    return out


def direct_us(server_port: int, model: str, texts: list[str], count: int) -> list[float]:
    """`count` calls one after another straight to the server's unix socket, with the texts'
    token ids ready (the gateway's tokenizer): the hop and the server alone, µs each."""
    from tokenizers import Tokenizer

    from embedserve.contract.codec import encode_request
    from embedserve.contract.local import LocalEmbedClient, local_socket_for
    from embedserve.core.head import Head
    from embedserve.loading.bundled import resolve_model

    path = local_socket_for(f"127.0.0.1:{server_port}")
    if path is None:
        raise RuntimeError(f"no local socket for the server on port {server_port}")
    tokenizer = Tokenizer.from_file(str(Path(resolve_model(model)) / "tokenizer.json"))
    # NOTE: a tokenizer.json may pad (MiniLM's pads every text to 128 ids), the gateway does not:
    # the ids sent must be the gateway's (before 2026-12-04 this sent 128-id queries)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    requests = [encode_request([e.ids], Head(384, True, "float32")) for e in
                tokenizer.encode_batch(texts)]  # fmt: skip

    async def calls() -> list[float]:
        client = LocalEmbedClient(path)
        out = []
        for i in range(count):
            t0 = time.perf_counter()
            await client(requests[i % len(requests)], timeout=30)
            out.append((time.perf_counter() - t0) * 1e6)
        await client.close()
        return out

    return asyncio.run(calls())


def hops(server_port: int, port: int, model: str, texts: list[str]) -> dict[str, float]:
    """p50 µs of one short query at a time: the no-op HTTP floor, the server directly, the
    whole path; and what the gateway adds (whole - server - floor)."""
    with loadgen.noop_server(1) as noop:
        floor = percentile(sequential_us(noop, texts, HOP_REQUESTS)[50:], 50)
    server = percentile(direct_us(server_port, model, texts, HOP_REQUESTS)[50:], 50)
    whole = percentile(sequential_us(port, texts, HOP_REQUESTS)[50:], 50)
    return {
        "http_floor_us": floor,
        "server_direct_us": server,
        "whole_path_us": whole,
        "gateway_adds_us": whole - server - floor,
    }


def bodies() -> tuple[list[bytes], list[bytes]]:
    """Short queries, and requests of 100 passages (8-180 words) each."""
    queries = [json.dumps({"input": q, "model": NAME}).encode() for q in corpus.queries(256)]
    passages = corpus.passages(800, max_words=180)
    bulk = [
        json.dumps({"input": passages[i : i + 100], "model": NAME, "encoding_format": "base64",
                    "truncate": "end"}).encode()
        for i in range(0, 800, 100)
    ]  # fmt: skip
    return queries, bulk


def record(tree: str, workers: int, load: str, clients: int, metric: str, value: float) -> dict[str, Any]:  # fmt: skip
    return {
        "system": f"embedserve {tree} (null engine), gateway workers {workers}",
        "model": "all-MiniLM-L6-v2 (tokenizer and spec; no forward)",
        "weights": "none",
        "dtype": "none",
        "batch": 1 if load == "queries" else 100,
        "tokens": "3-12 words" if load == "queries" else "8-180 words",
        "concurrency": clients,
        "metric": metric,
        "value": round(value, 3),
        "scope": "end_to_end",
    }


def measure_tree(
    tree: str, src: str, gateway_args: list[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    queries, bulk = bodies()
    texts = corpus.queries(64)
    records: list[dict[str, Any]] = []
    for workers in (int(w) for w in args.workers.split(",")):
        server, gateway, server_port, port = start_pair(src, args.model, workers, gateway_args)
        pids = {"gateway": gateway.proc.pid, "server": server.proc.pid}
        try:
            loadgen.run(port, loadgen.split(queries, 4), 1.0)  # warm-up
            loads = [("queries", int(c), queries) for c in args.clients.split(",")]
            loads.append(("bulk", 4, bulk))
            for load, clients, sent in loads:
                out = measured_load(port, sent, clients, args.seconds, pids)
                print(f"{tree} w{workers} {load} x{clients}: " + ", ".join(
                    f"{k} {v:.4g}" for k, v in out.items()), flush=True)  # fmt: skip
                for metric, value in out.items():
                    records.append(record(tree, workers, load, clients, metric, value))
            for metric, value in hops(server_port, port, args.model, texts).items():
                print(f"{tree} w{workers} hop {metric} {value:.0f}", flush=True)
                records.append(record(tree, workers, "queries", 1, metric, value))
        finally:
            gateway.stop(30)
            server.stop(30)
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--tree",
        action="append",
        default=None,
        help="NAME=SRC, or NAME=SRC@ARGS: the gateway's extra flags (repeatable)",
    )
    ap.add_argument("--model", default="minilm", help="a model folder, or minilm (bundled)")
    ap.add_argument("--workers", default="1", help="gateway workers, e.g. 1,2")
    ap.add_argument("--clients", default="1,16", help="client processes of short queries")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    args = ap.parse_args()
    trees = [t.split("=", 1) for t in (args.tree or [f"head={ROOT / 'src'}"])]
    records = []
    for name, given in trees:
        src, _, extra = given.partition("@")
        records += measure_tree(name, str(Path(src).resolve()), extra.split(), args)
    cores = os.cpu_count()
    notes = (
        f"Null engine (benchmarks/harness/null_engine.py): the real server process and gateway, "
        f"every sequence answered at once with a fixed vector. Client processes on the same "
        f"{cores}-core machine (they take CPU too: 'machine_busy_cores'). Load average at the "
        f"end {load1():.2f}. *_cores: CPU seconds of that side's processes over the window; "
        f"requests_per_*_core: requests / those CPU seconds. Hop rows: p50 µs of {HOP_REQUESTS} "
        f"sequential short queries (first 50 left out); gateway_adds_us = whole - server - floor."
    )
    slug = f"{report.card_slug()}host" if _has_gpu() else "cpu2" if cores == 2 else f"cpu{cores}"
    _, table = report.write(
        "null-path", report.cpu_hardware(), slug, records,
        report.versions("uvicorn", "httptools", "grpcio", "orjson"), notes, args.out,
    )  # fmt: skip
    print(table)


def _has_gpu() -> bool:
    return Path("/dev/nvidia0").exists()


if __name__ == "__main__":
    main()
