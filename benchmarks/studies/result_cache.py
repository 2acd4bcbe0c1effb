"""The result cache (`--cache-size`, issue 56): `embedserve serve` on the bundled MiniLM, on the
CPU, without and with `--cache-size 64000000`, under a query log drawn from a Zipf distribution
(s = 1.1) over 10,000 distinct queries (`harness.corpus.queries`, 3-12 words each), in one run.

Each (side, connections) gets a fresh server, so every cached side starts cold and the log is
replayed from its start: wrk (one thread) posts the log's bodies in turn, one query per request,
for `--seconds` (at one connection a Python keep-alive client instead: `one_client`), after a
warm-up of other queries (not in the log). req/s, p50 and p99 are the client's;
the hit rate is /metrics' hits over hits + misses in the window; `log_repeat_share` is the share
of the requests served whose query had come before in the log (what a cache that never evicts
could answer: the bar for the hit rate).

    PYTHONPATH=src python3 benchmarks/studies/result_cache.py [--seconds 20] [--connections 1,16]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.machine import load1
from harness.servers import serve
from studies.native_path import lua_script, wrk

DISTINCT = 10_000
ZIPF_S = 1.1
LOG = 100_000  # requests in the log: more than a run serves, so it is never replayed in a run
CACHE_SIZE = 64_000_000


def distinct_queries(count: int) -> list[str]:
    """`count` distinct query strings, in first-drawn order (rank 1 first)."""
    seen: dict[str, None] = {}
    for q in corpus.queries(count * 5):
        seen.setdefault(q, None)
        if len(seen) == count:
            return list(seen)
    raise ValueError(f"the corpus gave only {len(seen)} distinct queries")


def zipf_log(count: int, distinct: int, s: float, seed: int = 56) -> np.ndarray:
    """`count` ranks in [0, distinct): P(rank k) proportional to (k + 1) ** -s."""
    weights = np.arange(1, distinct + 1, dtype=np.float64) ** -s
    return np.random.default_rng(seed).choice(distinct, size=count, p=weights / weights.sum())


def body(text: str) -> bytes:
    return json.dumps({"input": text, "model": "minilm"}).encode()


def cache_counts(port: int) -> tuple[float, float]:
    """(hits, misses) so far, from /metrics (0, 0 without the cache)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()

    def value(name: str) -> float:
        found = re.search(rf"^embedserve_gateway_cache_{name}_total (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    return value("hits"), value("misses")


def repeat_share(ranks: np.ndarray) -> float:
    """The share of `ranks` seen before in it."""
    return 1.0 - len(set(ranks.tolist())) / len(ranks) if len(ranks) else 0.0


def one_client(port: int, bodies: list[bytes], seconds: float) -> dict[str, float]:
    """One keep-alive client posting `bodies` in turn for `seconds`, each after the last
    answer. NOTE: not wrk: at one connection wrk saw 31 ms per uncached query where this client
    saw 4.3 ms on the same server (wrk's p50 at 16 connections agrees with its rate)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json"}
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        connection.request("POST", "/v1/embeddings", bodies[len(times) % len(bodies)], headers)
        reply = connection.getresponse()
        reply.read()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}")
        times.append((time.perf_counter() - start) * 1e3)
    connection.close()
    times.sort()
    return {"requests": float(len(times)), "requests_per_s": len(times) / seconds,
            "p50_ms": statistics.median(times), "p99_ms": times[int(0.99 * len(times))],
            "errors": 0.0}  # fmt: skip


def run_side(flags: list[str], bodies: list[bytes], log: Path, warm: Path, ranks: np.ndarray,
             connections: int, seconds: float) -> dict[str, float]:  # fmt: skip
    child, port = serve("--device", "cpu", *flags)
    try:
        wrk(port, warm, connections, 2.0)  # the engine warm; these queries are not in the log
        hits0, misses0 = cache_counts(port)
        load = load1()  # the machine's 1-minute load as the window starts (others' work too)
        if connections == 1:
            out = one_client(port, bodies, seconds)
        else:
            out = wrk(port, log, connections, seconds)
        hits, misses = cache_counts(port)
    finally:
        child.stop()
    looked = (hits - hits0) + (misses - misses0)
    out["hit_rate"] = (hits - hits0) / looked if looked else 0.0
    out["log_repeat_share"] = repeat_share(ranks[: int(out["requests"])])
    out["load1_at_start"] = load
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--connections", default="1,16")
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    args = ap.parse_args()
    queries = distinct_queries(DISTINCT)
    ranks = zipf_log(LOG, DISTINCT, ZIPF_S)
    folder = Path(tempfile.mkdtemp(prefix="result-cache-"))
    bodies = [body(queries[r]) for r in ranks]
    log = lua_script(bodies, folder)
    others = [q for q in corpus.queries(2000, seed=7) if q not in set(queries)][:200]
    warm = lua_script([body(q) for q in others], folder)
    sides = {"without cache": [], f"--cache-size {CACHE_SIZE}": ["--cache-size", str(CACHE_SIZE)]}
    records: list[dict[str, Any]] = []
    for connections in [int(c) for c in args.connections.split(",")]:
        for side, flags in sides.items():
            out = run_side(flags, bodies, log, warm, ranks, connections, args.seconds)
            print(side, connections, {k: round(v, 3) for k, v in out.items()}, flush=True)
            for metric in ("requests_per_s", "p50_ms", "p99_ms", "hit_rate", "log_repeat_share",
                           "requests", "errors", "load1_at_start"):  # fmt: skip
                records.append({
                    "system": f"embedserve serve, {side}", "model": "all-MiniLM-L6-v2",
                    "weights": "real", "dtype": "engine default", "batch": 1,
                    "tokens": "one query (3-12 words)", "concurrency": connections,
                    "metric": metric, "value": round(out[metric], 4), "scope": "end_to_end",
                })  # fmt: skip
    notes = (
        f"A log of {LOG:,} queries drawn from a Zipf distribution (s = {ZIPF_S}, seed 56) over "
        f"{DISTINCT:,} distinct ones, posted in turn for {args.seconds:g} s (1 connection: one "
        "Python keep-alive client, each request after the last answer; more: wrk, 1 thread) "
        "to a fresh `embedserve serve --device cpu` per row (the cache cold at the start), "
        "after 2 s of 200 other queries. hit_rate: /metrics' cache hits / (hits + misses) in "
        "the window; log_repeat_share: the share of the requests served whose query came "
        f"earlier in the log (a cache that never evicts). {os.cpu_count()} cores, nothing "
        "pinned: the load generator shares them with the server, and the machine was shared "
        "with other work (load1_at_start). wrk at 1 connection measured 31 ms per uncached "
        "query where the Python client measured 4.3 ms on the same server: not used there."
    )
    _, table = report.write(
        "result-cache", report.cpu_hardware(), "cpu2" if os.cpu_count() == 2 else "cpu",
        records, report.versions("torch", "onnxruntime"), notes, args.out,
    )  # fmt: skip
    print(table)
    print(notes)


if __name__ == "__main__":
    main()
