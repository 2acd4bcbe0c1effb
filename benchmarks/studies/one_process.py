"""`serve --native` (one process) against `serve`: one short query over HTTP, and batches under
load (issues 25, 38 and 55).

Both serve the bundled MiniLM with the CPU defaults. Each round, each server answers `--requests`
sequential short queries with the other idle (`--in-turn`: request by request in turn; see
http_ab.http_p50s for why alone is the default here), the first 30 left out, and a fresh process
times `Embedder.encode` the same way; then, with `--clients`, each server takes closed-loop short
queries from that many client processes for `--seconds`. Writes
results/studies/one-process-cpuN-YYYYMMDD.json.

(Its first form, 2026-12-04/05, measured two prototypes of the shape before it was built:
results/studies/one-process-cpu2-20261202 and -20261205; then `serve --one-process`, which
-20261207 measured beside `serve --native` before it was removed.)

    .venv/bin/python benchmarks/studies/one_process.py [--rounds 8] [--clients 4,16]
        [--native-also '--batch-wait-ms 0'] [--native-also 'GOMP_SPINCOUNT=10000']
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import corpus, loadgen, report
from http_ab import IN_PROCESS, SERVE, WARM, clean_env, http_p50s, start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--in-turn", action="store_true", help="the servers called request by request")
    ap.add_argument("--clients", default="", help="comma-separated client counts (none: skip)")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--native-also", action="append", default=[],
                    help="one more `serve --native` with these flags and NAME=VALUE variables, "
                         "e.g. '--batch-wait-ms 0' or 'GOMP_SPINCOUNT=10000'")  # fmt: skip
    args = ap.parse_args()
    servers = {
        "serve": start("src", {}),  # --no-native: the Python path
        "serve --native": start("src", {}, [*SERVE, "--native"]),
    }
    for also in args.native_also:
        words = also.split()
        env = dict(w.split("=", 1) for w in words if not w.startswith("-") and "=" in w)
        flags = [w for w in words if w.startswith("-") or "=" not in w]
        servers[f"serve --native {also}"] = start("src", env, [*SERVE, "--native", *flags])
    queries = corpus.queries(256)
    bodies = [json.dumps({"input": t}).encode() for t in queries]
    counts = [int(c) for c in args.clients.split(",") if c]
    p50s: dict[str, list[float]] = {name: [] for name in servers} | {"in process": []}
    loads: dict[str, dict[int, list[dict[str, float]]]] = {
        n: {c: [] for c in counts} for n in servers
    }
    code = IN_PROCESS.format(bench=str(Path(__file__).resolve().parents[1]), warm=WARM,
                             n=args.requests)  # fmt: skip
    try:
        for r in range(args.rounds):
            ports = [p for _, p in servers.values()]
            p50 = http_p50s(ports, queries[:64], args.requests, not args.in_turn, r)
            for name, value in zip(servers, p50, strict=True):
                p50s[name].append(round(value, 3))
            out = subprocess.run([sys.executable, "-c", code], env=clean_env("src"),
                                 capture_output=True, text=True, check=True)  # fmt: skip
            p50s["in process"].append(round(float(out.stdout.split()[-1]), 3))
            for clients in counts:
                for k in range(len(servers)):
                    name = list(servers)[(r + k) % len(servers)]
                    run = loadgen.run(
                        servers[name][1], loadgen.split(bodies, clients), args.seconds
                    )
                    loads[name][clients].append({k: round(v, 2) for k, v in run.summary().items()})
            print(r, {k: v[-1] for k, v in p50s.items()},
                  {n: {c: v[-1]["requests_per_s"] for c, v in d.items()} for n, d in loads.items()},
                  flush=True)  # fmt: skip
    finally:
        for p, _ in servers.values():
            os.killpg(p.pid, signal.SIGTERM)
    over = {
        name: statistics.median(a - b for a, b in zip(p50s[name], p50s["in process"], strict=True))
        for name in servers
    }
    doc = {
        "hardware": report.cpu_hardware(), "commit": report.commit(), "date": report.today(),
        "what": "one short query over HTTP, p50 (ms) per round, each server "
                + ("called in turn" if args.in_turn else "alone, the order rotated")
                + ", Embedder.encode in a fresh process after each round; then closed-loop "
                f"clients of short queries, {args.seconds} s per server and count, in turn",
        "p50_ms": p50s, "median_ms": {k: statistics.median(v) for k, v in p50s.items()},
        "over_in_process_ms_median": over,
        "load": loads,
        "load_median_requests_per_s": {
            n: {c: statistics.median(x["requests_per_s"] for x in v) for c, v in d.items()}
            for n, d in loads.items()
        },
        "rounds": args.rounds,
    }  # fmt: skip
    path = report.write_json(f"one-process-cpu{os.cpu_count()}", doc)
    print(doc["median_ms"], "over in process", over, doc["load_median_requests_per_s"],
          f"wrote {path}")  # fmt: skip


if __name__ == "__main__":
    main()
