"""Where a short query's HTTP time goes on a small CPU: `serve` variants against in process.

One client, one short query per request on one keep-alive connection (`--requests` of them,
the first tenth left out), for `embedserve serve` started in several ways that differ in one
thing each, beside `Embedder.encode([query])` in this process (the floor the HTTP path adds to):

- `default`: `serve` as a user starts it;
- `omp-passive`: the server's OpenMP threads sleep at once after each parallel region
  (OMP_WAIT_POLICY=PASSIVE) instead of spinning on the cores the gateway needs;
- `omp-default`: libgomp's own wait (OMP_WAIT_POLICY empty) instead of the server's bounded spin;
- `threads-1`: the server computes on one thread (OMP_NUM_THREADS=1: `serve` sets no
  `--cpu-threads` of its own for one model), leaving a core to the gateway and the client;
- `tokenizers-serial`: the gateway's tokenizer without its thread pool (TOKENIZERS_PARALLELISM
  =false);
- any combination given with `--variants`.

Writes results/studies/http-path-cpu2-YYYYMMDD.json (+ .md).

    .venv/bin/python benchmarks/studies/http_path_cpu.py [--requests 600] [--variants a,b+c]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.gateway import sequential_us
from harness.machine import load1
from harness.servers import serve
from harness.timing import percentile

# each variant: (environment of the serve process, extra flags)
CHANGES: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "default": ({}, ()),
    "omp-passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, ()),
    # OpenMP's own wait (the server's before its bounded spin, `cpu_threads.apply_server`)
    "omp-default": ({"OMP_WAIT_POLICY": ""}, ()),
    "threads-1": ({"OMP_NUM_THREADS": "1"}, ()),
    "tokenizers-serial": ({"TOKENIZERS_PARALLELISM": "false"}, ()),
}


def in_process_us(texts: list[str], n: int) -> list[float]:
    from embedserve import Embedder

    e = Embedder("minilm", device="cpu")
    for t in texts[:32]:
        e.encode([t])
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        e.encode([texts[i % len(texts)]])
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def http_us(variant: str, texts: list[str], n: int) -> list[float]:
    env: dict[str, str] = {}
    flags: list[str] = []
    for part in variant.split("+"):
        e, f = CHANGES[part]
        env.update(e)
        flags.extend(f)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        child, port = serve("--device", "cpu", *flags)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        sequential_us(port, texts, 64)  # connections, buckets, caches warm
        return sequential_us(port, texts, n)
    finally:
        child.stop(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--variants", default="default,omp-passive,threads-1,tokenizers-serial")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    texts = corpus.queries(256)
    n, skip = args.requests, args.requests // 10
    rows: list[tuple[str, list[float], float]] = []
    load = load1()
    rows.append(("in process (Embedder.encode)", in_process_us(texts, n)[skip:], load))
    for variant in args.variants.split(","):
        load = load1()
        rows.append((f"HTTP serve: {variant}", http_us(variant, texts, n)[skip:], load))
        print(f"{variant}: p50 {percentile(rows[-1][1], 50) / 1e3:.2f} ms", flush=True)
    floor = percentile(rows[0][1], 50)
    records: list[dict[str, Any]] = [
        {
            "system": name,
            "p50_ms": round(percentile(us, 50) / 1e3, 3),
            "p99_ms": round(percentile(us, 99) / 1e3, 3),
            "over_in_process_ms": round((percentile(us, 50) - floor) / 1e3, 3),
            "load1_before": load,
        }
        for name, us, load in rows
    ]
    doc = {
        "study": "http-path-cpu2",
        "hardware": report.cpu_hardware(),
        "commit": report.commit(),
        "date": report.today(),
        "command": report.command_line(),
        "requests": n - skip,
        "texts": "3-12-word queries (benchmarks/harness/corpus.py), one per request",
        "records": records,
    }
    path = report.write_json("http-path-cpu2", doc, args.out)
    lines = [
        f"# HTTP path of one short query, {doc['hardware']}",
        "",
        f"commit {doc['commit']}, {doc['date']}; {n - skip} sequential requests per row, one client",
        "",
        "| system | p50 ms | p99 ms | p50 over in process (ms) | load before |",
        "|---|---|---|---|---|",
        *(
            f"| {r['system']} | {r['p50_ms']} | {r['p99_ms']} | {r['over_in_process_ms']} | "
            f"{r['load1_before']:.2f} |"
            for r in records
        ),
    ]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
