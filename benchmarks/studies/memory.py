"""A server's resident memory around one large request, on the CPU: idle, at its peak while a
1,200-passage request runs (sampled every 50 ms), and once idle again, after the engine thread
has handed freed memory back (`server.trim.release_free_memory`).

    PYTHONPATH=src python3 benchmarks/studies/memory.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.http_calls import post_status
from harness.machine import rss_mb
from harness.servers import CLI, start

from embedserve.processes import descendants


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    args = ap.parse_args()
    server, ready = start([*CLI, "serve", "--device", "cpu", "--port", "0"],
                          r"serving \S+ at http://127\.0\.0\.1:(\d+)")  # fmt: skip
    port = int(ready.group(1))
    try:
        servers = set()
        for pid in descendants(server.proc.pid):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"\0server\0" in f.read():
                    servers.add(pid)
        post_status(port, {"input": "warm"})
        time.sleep(1)
        idle = rss_mb(servers)
        peak, done = idle, threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.05):
                peak = max(peak, rss_mb(servers))

        sampler = threading.Thread(target=sample)
        sampler.start()
        texts = corpus.passages(1200, min_words=150, max_words=180)
        status = post_status(port, {"input": texts, "truncate": "end"}, timeout=600)
        done.set()
        sampler.join()
        time.sleep(1)
        post_status(port, {"input": "after"})  # the engine thread comes round once more
        time.sleep(1)
        after = rss_mb(servers)
    finally:
        server.stop(30)
    doc = {"hardware": report.cpu_hardware(), "commit": report.commit(),
           "date": time.strftime("%Y-%m-%d"), "request": "1,200 passages of 150-180 words",
           "status": status, "server_rss_mb": {"idle": round(idle), "peak during the request":
           round(peak), "idle again after it": round(after)}}  # fmt: skip
    report.write_json(f"memory-cpu{os.cpu_count()}", doc, args.out)
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
