"""A soak: `embedserve serve` on the CPU under steady mixed load (short queries from 4 client
processes, plus a 100-passage request every few seconds) for `--seconds`; the resident memory of
all its processes sampled along the way. Growth is measured from the sample after warm-up.

    PYTHONPATH=src python3 benchmarks/studies/soak.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, loadgen, report
from harness.machine import rss_mb
from harness.servers import CLI, start

from embedserve.processes import descendants


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    args = ap.parse_args()
    server, ready = start([*CLI, "serve", "--device", "cpu", "--port", "0"],
                          r"serving \S+ at (http://127\.0\.0\.1:(\d+))")  # fmt: skip
    port = int(ready.group(2))
    bodies = [json.dumps({"input": q}).encode() for q in corpus.queries(64)]
    bulk = json.dumps({"input": corpus.passages(100), "truncate": "end"})
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def big_requests() -> None:
        while not stop.wait(3.0):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            conn.request("POST", "/v1/embeddings", bulk, {"Content-Type": "application/json"})
            conn.getresponse().read()
            conn.close()

    try:
        pids = descendants(server.proc.pid) | {server.proc.pid}
        loadgen.run(port, loadgen.split(bodies, 4), 5.0)  # warm-up
        t0 = time.monotonic()
        bulk_thread = threading.Thread(target=big_requests)
        bulk_thread.start()
        result = {}

        def sample() -> None:
            while not stop.wait(5.0):
                samples.append((round(time.monotonic() - t0, 1), round(rss_mb(pids), 1)))

        sampler = threading.Thread(target=sample)
        sampler.start()
        result = loadgen.run(port, loadgen.split(bodies, 4), args.seconds).summary()
        stop.set()
        bulk_thread.join(120)
        sampler.join(10)
    finally:
        server.stop(30)
    first, last = samples[0][1], samples[-1][1]
    doc = {
        "hardware": report.cpu_hardware(),
        "commit": report.commit(),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": args.seconds,
        "requests": int(result["requests"]),
        "errors": int(result["errors"]),
        "p99_ms": round(result["p99_ms"], 1),
        "rss_mb_samples (s, MB)": samples,
        "growth_from_first_sample_percent": round((last - first) / first * 100, 2),
    }
    report.write_json("soak-cpu", doc, args.out)
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
