"""`embedserve serve` on the CPU with OpenMP's default (spinning) waits against passive ones:
16 client processes of one short query each, rounds alternating the two, one script run. The
server keeps OpenMP's default because of this (src/embedserve/cpu_threads.py).

    PYTHONPATH=src python3 benchmarks/studies/omp_serve.py [--rounds 2] [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, loadgen, report
from harness.servers import CLI, start

# an empty OMP_WAIT_POLICY is OpenMP's default (cpu_threads keeps a value the user set)
POLICIES = {"openmp default (spin)": "", "passive": "PASSIVE"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    args = ap.parse_args()
    bodies = [json.dumps({"input": q}).encode() for q in corpus.queries(256)]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in POLICIES}
    for r in range(args.rounds):
        order = list(POLICIES.items())
        for name, policy in order if r % 2 == 0 else order[::-1]:
            os.environ["OMP_WAIT_POLICY"] = policy  # inherited by serve's children
            server, ready = start([*CLI, "serve", "--device", "cpu", "--port", "0"],
                                  r"serving \S+ at http://127\.0\.0\.1:(\d+)")  # fmt: skip
            port = int(ready.group(1))
            try:
                loadgen.run(port, loadgen.split(bodies, 16), 2.0)
                s = loadgen.run(port, loadgen.split(bodies, 16), args.seconds).summary()
            finally:
                server.stop(30)
            runs[name].append({k: round(s[k], 1) for k in ("requests_per_s", "p99_ms")})
            print(name, runs[name][-1], flush=True)
    doc = {"hardware": report.cpu_hardware(), "commit": report.commit(),
           "date": time.strftime("%Y-%m-%d"), "clients": 16, "seconds": args.seconds,
           "rounds": runs}  # fmt: skip
    report.write_json(f"omp-serve-cpu{os.cpu_count()}", doc, args.out)
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
