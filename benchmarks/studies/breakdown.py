"""Where one short query's time goes, stage by stage: a differential breakdown (suite 4's floor).

Each row runs the same one-query requests (p50 of `--requests` sequential calls, one client) on a
stack that differs from the previous one by one stage, so the differences are the stages:

| measured                      | what it holds                                                  |
|-------------------------------|----------------------------------------------------------------|
| engine step                   | `Engine.step(batch).wait()` in process (host work + device)     |
| gateway app in process        | ASGI call of the gateway: JSON, request core, tokenize, body    |
| gRPC to a no-op server        | grpc.aio unary round trip + the service's queue, no model       |
| gRPC to the real server       | the same + the engine                                           |
| unix socket to the real server| the local transport a gateway on the server's host uses         |
|   server stages (mean)        | inside that server: queue, launch, device, encode, deliver      |
| HTTP floor (uvicorn, no-op)   | http.client + uvicorn + a raw ASGI app answering a fixed body   |
| HTTP gateway + no-op server   | everything but the model (over gRPC: the no-op server has no socket) |
| HTTP end to end (`serve`)     | what a user waits                                               |

Text: one-word to 12-word queries from Python docstrings (benchmarks/harness/corpus.py). Writes
`concurrency-<hw>-breakdown-YYYYMMDD.json` + `.md`.

    PYTHONPATH=src python3 benchmarks/studies/breakdown.py --model DIR --device cuda [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.gateway import asgi_overhead_us, sequential_us
from harness.servers import CLI, harness_call, stage_sums, start
from harness.timing import median, percentile

from embedserve.processes import Child

NOOP_WIDTH = 384  # the width of the no-op server's rows (harness.gateway.noop_server)


def grpc_round_trips_us(address: str, ids: list[list[int]], count: int) -> list[float]:
    """Sequential Embed calls with packed ids, as the gateway sends them."""
    import grpc

    from embedserve.contract import EmbedRequest, embed_stub

    requests = [
        EmbedRequest(
            input_ids=np.asarray(x, dtype="<i4").tobytes(),
            seqlens=[len(x)],
            dimensions=0,
            normalize=True,
            output_dtype="float32",
        )
        for x in ids
    ]

    async def run() -> list[float]:
        async with grpc.aio.insecure_channel(address) as channel:
            call = embed_stub(channel)
            out = []
            for i in range(count):
                t0 = time.perf_counter()
                await call(requests[i % len(requests)], timeout=30)
                out.append((time.perf_counter() - t0) * 1e6)
            return out

    return asyncio.run(run())


def local_round_trips_us(address: str, ids: list[list[int]], count: int) -> list[float]:
    """The same calls over the server's unix socket (`contract.local`), as a local gateway."""
    from embedserve.contract import EmbedRequest
    from embedserve.contract.local import LocalEmbedClient, local_socket_for

    path = local_socket_for(address)
    assert path is not None, f"no local socket for {address}"
    requests = [
        EmbedRequest(
            input_ids=np.asarray(x, dtype="<i4").tobytes(),
            seqlens=[len(x)],
            normalize=True,
            output_dtype="float32",
        )
        for x in ids
    ]

    async def run() -> list[float]:
        client = LocalEmbedClient(path)
        out = []
        for i in range(count):
            t0 = time.perf_counter()
            await client(requests[i % len(requests)], timeout=30)
            out.append((time.perf_counter() - t0) * 1e6)
        await client.close()
        return out

    return asyncio.run(run())


def http_floor_us(count: int) -> list[float]:
    """A raw ASGI app under uvicorn answering a fixed embedding body: HTTP + client floor."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, _ = start([sys.executable, __file__, "--floor-server", str(port)], r"floor: ready")
    try:
        time.sleep(0.5)
        return sequential_us(port, ["x"], count)
    finally:
        server.stop(10)


def gateway_noop_us(model: str, noop_address: str, texts: list[str], count: int) -> list[float]:
    """HTTP through a real gateway to the no-op server: everything but the model."""
    gateway = Child([*CLI, "gateway", "--no-native", "--model", model, "--replica", noop_address,
                     "--port", "0"])  # fmt: skip
    try:
        url = gateway.wait_for(r"embedserve gateway: listening on (\S+)", 120).group(1)
        return sequential_us(int(url.rsplit(":", 1)[1]), texts, count)
    finally:
        gateway.stop(10)


def floor_server(port: int) -> None:
    import uvicorn

    body = json.dumps(
        {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.05] * 384}]}
    ).encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    print("floor: ready", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=None, help="default: results/concurrency/")
    parser.add_argument("--tag", default="", help="suffix of the results' file name")
    parser.add_argument("--weights", default="real", help="real, or random (an exact-shape folder)")
    parser.add_argument(
        "--lengths",
        default=None,
        metavar="LO-HI",
        help="texts of LO to HI tokens (passages) instead of 3-12-word queries",
    )
    parser.add_argument("--floor-server", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server is not None:
        floor_server(args.floor_server)
        return 0
    n = args.requests
    skip = n // 10  # warm-up calls left out of every figure
    texts, lengths, ids, steps, hardware, width = engine_steps(args, n)
    rows: list[tuple[str, list[float]]] = [("engine step", steps[skip:])]
    rows.append(("gateway app in process", asgi_overhead_us(texts, n, args.model)[skip:]))
    stages = server_rows(args, texts, ids, n, skip, width, rows)
    serve = Child([*CLI, "serve", "--model", args.model, "--device", args.device, "--port", "0"])
    try:
        url = serve.wait_for(r"embedserve: serving \S+ at (\S+)", 600).group(1)
        serve.forget_output()
        port = int(url.rsplit(":", 1)[1])
        rows.append(("HTTP end to end (serve)", sequential_us(port, texts, n)[skip:]))
    finally:
        serve.stop(30)
    write(args, hardware, lengths, rows, stages, n, skip)
    return 0


def engine_steps(args: argparse.Namespace, n: int) -> tuple[list[str], str, list[list[int]], list[float], str, int]:  # fmt: skip
    """The texts (queries, or passages of `--lengths`), their ids, and `n` engine steps (µs) of
    one text each in this process; the device type and the model's width."""
    from embedserve.embedder import Embedder
    from embedserve.engine.batch import PackedBatch

    embedder = Embedder(args.model, device=args.device)
    texts, lengths = corpus.queries(256), "3-12 words"
    if args.lengths:
        lo, hi = (int(x) for x in args.lengths.split("-"))
        candidates = corpus.passages(4000, min_words=lo // 2, max_words=hi)
        counts = [len(x) for x in embedder.tokenize(candidates, truncate="end")]
        texts = [t for t, n in zip(candidates, counts, strict=True) if lo <= n <= hi][:256]
        lengths = f"{lo}-{hi} tokens"
        if not texts:
            raise SystemExit(f"no passage of {args.lengths} tokens")
    ids = embedder.tokenize(texts)
    batches = [PackedBatch.from_token_lists([x]) for x in ids]
    for b in batches[:64]:  # each bucket: eager, captured, replayed
        for _ in range(3):
            embedder.engine.step(b).wait()
    steps = []
    for i in range(n):
        t0 = time.perf_counter()
        embedder.engine.step(batches[i % len(batches)]).wait()
        steps.append((time.perf_counter() - t0) * 1e6)
    hardware = embedder.engine.device.type
    width = embedder.engine.hidden_size
    return texts, lengths, ids, steps, hardware, width


def server_rows(args: argparse.Namespace, texts: list[str], ids: list[list[int]], n: int,
                skip: int, width: int, rows: list[tuple[str, list[float]]]) -> dict[str, float]:  # fmt: skip
    """The gRPC, unix-socket and HTTP rows against a no-op server and `embedserve server`; the
    server's mean µs per stage over the unix-socket run."""
    noop_server, noop_ready = start(harness_call("gateway:noop_server"), r"ready on (\S+)")
    noop = noop_ready.group(1)
    server = Child(
        [
            *CLI,
            "server",
            *("--model", args.model, "--device", args.device, "--port", "0"),
            *("--metrics-port", "0"),
        ]
    )
    stages: dict[str, float] = {}
    try:
        metrics_port = int(server.wait_for(r"metrics on http://\S+:(\d+)/metrics", 600).group(1))
        address = server.wait_for(r"embedserve server: ready on (\S+:\d+)", 600).group(1)
        server.forget_output()
        rows.append(("gRPC to a no-op server", grpc_round_trips_us(noop, ids, n)[skip:]))
        rows.append(("gRPC to the real server", grpc_round_trips_us(address, ids, n)[skip:]))
        before = stage_sums(metrics_port)
        rows.append(
            ("unix socket to the real server", local_round_trips_us(address, ids, n)[skip:])
        )
        after = stage_sums(metrics_port)
        for stage, (total, count) in after.items():
            done = count - before[stage][1]
            if done:
                stages[stage] = (total - before[stage][0]) / done * 1e6
        rows.append(("HTTP floor (uvicorn, no-op)", http_floor_us(n)[skip:]))
        if width == NOOP_WIDTH:  # the no-op server's rows: a gateway of another width refuses them
            rows.append(
                ("HTTP gateway + no-op server", gateway_noop_us(args.model, noop, texts, n)[skip:])
            )
    finally:
        server.stop(30)
        noop_server.stop(10)
    return stages


def write(args: argparse.Namespace, hardware: str, lengths: str,
          rows: list[tuple[str, list[float]]], stages: dict[str, float], n: int, skip: int) -> None:  # fmt: skip
    import torch

    from embedserve.engine.cpu import default_dtype

    name = torch.cuda.get_device_name() if hardware == "cuda" else report.cpu_hardware()
    base = {
        "system": "embedserve",
        "model": Path(args.model).name,
        "weights": args.weights,
        # the servers' default dtype on this device (bf16 on CUDA and on a native-bf16 CPU)
        "dtype": default_dtype(torch.device(hardware)),
        "batch": 1,
        "tokens": lengths,
        "concurrency": 1,
    }
    records = [
        {**base, "metric": f"p{q}_ms", "value": percentile(xs, q) / 1e3, "scope": stage}
        for stage, xs in rows
        for q in (50, 99)
    ]
    # inside the server, over the unix-socket run
    records += [
        {**base, "metric": "mean_ms", "value": mean_us / 1e3, "scope": f"server stage: {stage}"}
        for stage, mean_us in stages.items()
    ]
    p = {stage: median(xs) for stage, xs in rows}
    derived = {
        "gRPC + server service (no model)": p["gRPC to a no-op server"],
        "the engine inside the server": p["gRPC to the real server"] - p["gRPC to a no-op server"],
        "HTTP + client (floor)": p["HTTP floor (uvicorn, no-op)"],
    }
    if "HTTP gateway + no-op server" in p:
        derived["gateway beyond the HTTP floor"] = (
            p["HTTP gateway + no-op server"]
            - p["HTTP floor (uvicorn, no-op)"]
            - p["gRPC to a no-op server"]
        )
    notes = (
        f"p50 of {n - skip} sequential one-query requests after {skip} warm-up ones, per stack. "
        "Differences of p50s (µs): "
        + "; ".join(f"{k} {v:.0f}" for k, v in derived.items())
        + ". Inside the server during the unix-socket run, mean µs per stage "
        "(`embedserve_server_stage_seconds`): "
        + "; ".join(f"{k} {v:.1f}" for k, v in stages.items())
        + "."
    )
    _, table = report.write(
        "concurrency",
        name,
        (report.card_slug() if hardware == "cuda" else hardware) + "-breakdown" + args.tag,
        records,
        report.versions("torch", "grpcio", "uvicorn"),
        notes,
        args.out,
    )
    print(notes)
    print(table)


if __name__ == "__main__":
    sys.exit(main())
