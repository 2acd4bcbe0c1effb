"""`embedserve serve` under two or more sets of flags, loaded in turn (issue 38).

Each `--arm NAME=FLAGS` is one `serve` of the bundled model (or `--model`), all started at once
and idle but for their turn; each round loads every arm in turn at each level of short-query
client processes (`harness/loadgen.py`, closed loop), so the machine's drift falls on all arms
alike. Reported per arm and level: requests/s, p50 and p99 of every round.

    PYTHONPATH=src python3 benchmarks/studies/flags_ab.py --arm "bound0=--calls-in-flight 0" \\
        --arm "bound2=--calls-in-flight 2" [--levels 1,4,16] [--rounds 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import loadgen, report
from harness.servers import CLI, SERVING, start
from null_path import bodies as null_path_bodies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arm", action="append", required=True, help="NAME=FLAGS (repeatable)")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    queries, _ = null_path_bodies()  # short queries served as "minilm"
    arms = [a.split("=", 1) for a in args.arm]
    servers, ports = [], {}
    try:
        for name, flags in arms:
            child, ready = start(
                [*CLI, "serve", "--model", args.model, "--device", args.device, "--port", "0",
                 "--served-model-name", "minilm", *flags.split()],
                SERVING,
            )  # fmt: skip
            servers.append(child)
            ports[name] = int(ready.group(1))
            loadgen.run(ports[name], loadgen.split(queries, 4), 1.0)  # warm-up
        records: list[dict[str, Any]] = []
        for r in range(args.rounds):
            for clients in (int(c) for c in args.levels.split(",")):
                for name, flags in arms:
                    out = loadgen.run(ports[name], loadgen.split(queries, clients), args.seconds)
                    s = out.summary()
                    print(f"round {r + 1} x{clients} {name}: {s['requests_per_s']:.1f} req/s, "
                          f"p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms", flush=True)  # fmt: skip
                    for metric in ("requests_per_s", "p50_ms", "p99_ms", "errors"):
                        records.append({
                            "system": f"embedserve serve {flags}", "model": "all-MiniLM-L6-v2",
                            "weights": "real", "batch": 1, "tokens": "3-12 words",
                            "concurrency": clients, "metric": metric, "value": s[metric],
                            "scope": f"end_to_end, round {r + 1}",
                        })  # fmt: skip
    finally:
        for child in servers:
            child.stop(60)
    notes = (
        f"`embedserve serve --device {args.device}` under each arm's flags, all started at once, "
        f"loaded in turn ({args.seconds:g} s per arm, level and round; client processes on the "
        f"same machine, closed loop, one keep-alive connection each)."
    )
    _, table = report.write(
        "flags-ab", report.cpu_hardware(), f"{args.device}{args.tag}", records,
        report.versions("torch", "uvicorn"), notes, args.out,
    )  # fmt: skip
    print(table[-2500:])


if __name__ == "__main__":
    main()
