"""A/B of one engine step across two source trees, interleaved: is a latency change real?

Each round starts one process per tree (in turn, old then new, `--rounds` times) that builds the
engine on all-MiniLM-L6-v2, warms a 1 x 128-token batch up to graph replay, and times
`step(batch).wait()` with CUDA events (what `studies/engine_latency.py` reports as engine p50). Medians of
the rounds per tree go to `latency-<gpu>-ab-YYYYMMDD.json` + `.md`; `host_p50_ms` is the time
`step()` itself takes on the CPU before returning.

    PYTHONPATH=src python3 benchmarks/studies/step_ab.py --model DIR --tree old=PATH --tree new=src
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report
from harness.servers import BENCH
from harness.timing import median

CHILD = r"""
import json, sys
import numpy as np, torch
sys.path.insert(0, sys.argv[3])  # benchmarks/: the one percentile function
from harness.timing import percentile
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
engine = Engine.from_folder(sys.argv[1], device="cuda")
rng = np.random.default_rng(0)
batch = PackedBatch.from_token_lists([rng.integers(1000, 20000, 128).tolist()])
for _ in range(5):
    engine.step(batch).wait()
import time
times, host = [], []
for _ in range(int(sys.argv[2])):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    handle = engine.step(batch)
    host.append((time.perf_counter() - t0) * 1e3)
    end.record()
    end.synchronize()
    handle.wait()
    times.append(start.elapsed_time(end))
def noop():
    return None
t0 = time.perf_counter()
for _ in range(200000):
    noop()
python_call_ns = (time.perf_counter() - t0) / 200000 * 1e9
print(json.dumps({
    "python_call_ns": python_call_ns,
    "p50": percentile(times, 50),
    "p99": percentile(times, 99),
    "host_p50": percentile(host, 50),
}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH to a src dir")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=500)
    parser.add_argument("--out", type=Path, default=None, help="default: results/latency/")
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, path in trees.items():
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([path, os.environ.get("PYTHONPATH", "")]),
            }
            out = subprocess.run(
                [sys.executable, "-c", CHILD, args.model, str(args.reps), str(BENCH)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    import torch

    records = []
    for name, results in runs.items():
        for metric in ("p50", "p99", "host_p50", "python_call_ns"):
            records.append(
                {
                    "system": f"embedserve ({name}: {trees[name]})",
                    "model": "all-MiniLM-L6-v2",
                    "weights": "real",
                    "dtype": "bf16",
                    "batch": 1,
                    "tokens": 128,
                    "concurrency": 1,
                    "metric": metric if metric.endswith("_ns") else f"{metric}_ms",
                    "value": median(r[metric] for r in results),
                    "scope": {"host_p50": "engine_host_call", "python_call_ns": "process"}.get(
                        metric, "engine"
                    ),
                    "rounds": [r[metric] for r in results],
                }
            )
    notes = (
        f"Engine step (host work + graph replay, CUDA events), 1 x 128 random token ids, "
        f"{args.reps} timed steps per process after 5 warm-up steps; {args.rounds} rounds, the "
        "trees interleaved; the value is the median of the rounds."
    )
    hardware = torch.cuda.get_device_name()
    _, table = report.write(
        "latency",
        hardware,
        ("h200" if "H200" in hardware else "gpu") + "-ab",
        records,
        report.versions("torch"),
        notes,
        args.out,
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
