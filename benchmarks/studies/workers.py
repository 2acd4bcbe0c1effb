"""Gateway workers, side by side in one run: `embedserve serve` with 1, 2 and 4 gateway workers
(one server replica), 16 concurrent clients of one short query each, and 4 client processes of
100 passages per request. Rounds alternate the worker counts, so drift on the machine hits each
alike; the median round is shown. This is what the `serve --workers` default rests on.

    PYTHONPATH=src python3 benchmarks/studies/workers.py --model DIR [--out DIR] [--workers 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, loadgen, report
from harness.servers import CLI, start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, required=True, help="all-MiniLM-L6-v2 folder")
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--device", default="cuda", help="cpu only to try the script out")
    args = ap.parse_args()

    queries = [json.dumps({"input": q}).encode() for q in corpus.queries(256)]
    passages = corpus.passages(400, max_words=180)
    bulk = [
        json.dumps({"input": passages[i : i + 100], "encoding_format": "base64",
                    "truncate": "end"}).encode()
        for i in range(0, 400, 100)
    ]  # fmt: skip
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for workers in (int(w) for w in args.workers.split(",")):
            server, ready = start(
                [*CLI, "serve", "--model", str(args.model), "--device", args.device, "--port", "0",
                 "--workers", str(workers)],
                r"serving \S+ at http://127\.0\.0\.1:(\d+)",
            )  # fmt: skip
            port = int(ready.group(1))
            try:
                loadgen.run(port, loadgen.split(queries, 16), 1.0)  # warm-up: buckets captured
                loadgen.run(port, loadgen.split(bulk, 4), 2.0)
                q = loadgen.run(port, loadgen.split(queries, 16), args.seconds).summary()
                b = loadgen.run(port, loadgen.split(bulk, 4), args.seconds).summary()
            finally:
                server.stop(60)
            runs.setdefault((workers, "queries"), []).append(q)
            runs.setdefault((workers, "bulk"), []).append(b)
            print(f"{workers} workers: 16 clients {q}; 100 passages x 4 {b}", flush=True)

    def median(key: tuple[int, str], metric: str) -> float:
        return median(r[metric] for r in runs[key])

    base: dict[str, Any] = {"model": "all-MiniLM-L6-v2", "weights": "real", "scope": "end_to_end",
                            "dtype": "bf16" if args.device == "cuda" else "fp32"}  # fmt: skip
    records = []
    for workers in sorted({w for w, _ in runs}):
        system = f"embedserve serve --workers {workers}"
        for metric in ("requests_per_s", "p50_ms", "p99_ms"):
            records.append({**base, "system": system, "batch": 1, "tokens": "3-12 words",
                            "concurrency": 16, "metric": metric,
                            "value": round(median((workers, "queries"), metric), 3)})  # fmt: skip
        records.append({**base, "system": system, "batch": 100, "tokens": "8-180 words",
                        "concurrency": 4, "metric": "tokens_per_s",
                        "value": round(median((workers, "bulk"), "tokens_per_s"), 1)})  # fmt: skip
    notes = (
        f"One server replica; gateway workers {args.workers}; {args.rounds} alternating rounds of "
        f"{args.seconds} s per load, median round. Clients are processes (benchmarks/harness/loadgen.py)."
    )
    import torch

    hardware = torch.cuda.get_device_name() if args.device == "cuda" else report.cpu_hardware()
    _, table = report.write(
        "workers", hardware, report.card_slug() if args.device == "cuda" else "cpu-trial", records,
        report.versions("torch", "uvicorn"), notes, args.out,
    )  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
