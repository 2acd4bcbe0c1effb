"""The server's own cost per request, without sockets (issue 38): `EmbedService` in this process
in front of the null engine (`harness/null_engine.py`: the real engine's spec and checks, no
forward), fed ready EmbedRequests by N concurrent tasks of one event loop for a few seconds.
Requests/s and this process's CPU seconds per request; N=1 is one request per batch (the
threads' hand-offs per batch), N=16 sixteen per batch (the per-request Python).

Each `--tree NAME=SRC` runs in a process of its own with SRC first on the path, in alternation
`--rounds` times, so trees compare on the same machine in one run.

    PYTHONPATH=src python3 benchmarks/studies/server_inprocess.py --tree new=src --tree old=OLD/src
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report

BENCHMARKS = str(Path(__file__).resolve().parents[1])


def measure(clients: int, seconds: float) -> dict[str, float]:
    """In this process: the null server under `clients` tasks for `seconds`."""
    from harness.null_engine import NullEngine

    from embedserve.contract.codec import encode_request
    from embedserve.core.head import Head
    from embedserve.options import EngineOptions
    from embedserve.server import main as server_main
    from embedserve.server.scheduler import SchedulerConfig
    from embedserve.server.service import EmbedService

    engine = NullEngine(server_main.load_engine(EngineOptions(model="minilm", device="cpu")))
    head = Head(384, True, "float32")
    requests = [encode_request([[101, *range(2000, 2000 + n), 102]], head) for n in range(3, 12)]

    async def run() -> dict[str, float]:
        service = EmbedService(engine.seam(), SchedulerConfig())
        await service.start()
        done = 0
        stop = time.perf_counter() + seconds

        async def client(i: int) -> None:
            nonlocal done
            while time.perf_counter() < stop:
                await service.answer(requests[(i + done) % len(requests)])
                done += 1

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        await service.stop()
        return {"requests_per_s": done / wall, "cpu_us_per_request": cpu / done * 1e6,
                "requests_per_batch": done / max(service.num_batches, 1)}  # fmt: skip

    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tree", action="append", required=True, help="NAME=SRC (repeatable)")
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's clients
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(int(args.one), args.seconds)))
        return
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for tree in args.tree:
            name, src = tree.split("=", 1)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, BENCHMARKS])}
            for clients in args.clients.split(","):
                child = [sys.executable, __file__, "--tree", tree, "--one", clients,
                         "--seconds", str(args.seconds)]  # fmt: skip
                done = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
                got = json.loads(done.stdout.strip().splitlines()[-1])
                rows.append({"tree": name, "round": r + 1, "clients": int(clients), **got})
                print(rows[-1], flush=True)
    doc = {"suite": "server-inprocess", "hardware": report.cpu_hardware(),
           "cpu_flags": report.cpu_flags(), "commit": report.commit(), "date": report.today(),
           "trees": args.tree, "seconds": args.seconds, "rows": rows}  # fmt: skip
    path = report.write_json(f"server-inprocess-cpu{os.cpu_count()}", doc, args.out)
    table = ["| tree | round | clients | requests/s | CPU µs / request | requests / batch |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for x in rows:
        table.append(f"| {x['tree']} | {x['round']} | {x['clients']} | {x['requests_per_s']:,.0f} "
                     f"| {x['cpu_us_per_request']:.1f} | {x['requests_per_batch']:.1f} |")  # fmt: skip
    md = (f"# The server in process, null engine\n\n- hardware: {doc['hardware']}, flags "
          f"{doc['cpu_flags']}\n- commit: {doc['commit']}\n- date: {doc['date']}\n- trees: "
          f"{', '.join(args.tree)}\n\n" + "\n".join(table) + "\n")  # fmt: skip
    path.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
