"""One short query over HTTP, `embedserve serve` from two (or more) source trees called in turn,
beside `Embedder.encode` in process: an A/B of the request path on a small CPU (issue 25).

Each tree's `serve` (the bundled MiniLM, CPU defaults) is started once with the OpenMP variables
of this shell removed; then per round the servers answer `--requests` sequential short queries
each, one request to each in turn on its own keep-alive connection (the first 30 left out: the
machine's speed drifts by the second, so the servers are compared request by request), and a
fresh process measures `Embedder.encode([query])` of the first tree the same way.

    .venv/bin/python benchmarks/studies/http_ab.py main=src other=/path/to/other/src [--rounds 3]
    .venv/bin/python benchmarks/studies/http_ab.py a=src b=src --env b:RAYON_NUM_THREADS=1
    .venv/bin/python benchmarks/studies/http_ab.py new=src old=/path/to/old/src --burst
    .venv/bin/python benchmarks/studies/http_ab.py new=src old=/old/src --passages 100 \
        --env new:XDG_CACHE_HOME=/tmp/c-new --env old:XDG_CACHE_HOME=/tmp/c-old

With `--passages N` each request carries N passages (20-120 words, `truncate: "end"`) instead
of one query: the bulk path's A/B (no in-process row). Give each tree its own cache when the
trees' CPU executors differ: a start-up choice is remembered per machine and folder, not per
tree.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.gateway import interleaved_us, sequential_us
from harness.servers import SERVING
from harness.timing import median

WARM = 30
BURST_CLIENTS, BURST_REQUESTS = 8, 60
IN_PROCESS = """
import sys, time
sys.path.insert(0, {bench!r})
from harness import corpus
from embedserve import Embedder
e, q = Embedder(), corpus.queries(64)
for i in range({warm}): e.encode([q[i % 64]])
ts = []
for i in range({n}):
    t = time.perf_counter(); e.encode([q[i % 64]]); ts.append(time.perf_counter() - t)
print(sorted(ts)[len(ts) // 2] * 1e3)
"""


def clean_env(src: str) -> dict[str, str]:
    drop = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "PYTHONPATH")
    return {k: v for k, v in os.environ.items() if k not in drop} | {"PYTHONPATH": src}


SERVE = [sys.executable, "-m", "embedserve.cli.main", "serve", "--port", "0"]
PYTHON_SERVE = [
    *SERVE,
    "--no-native",
]  # the Python path (`serve`'s default is native since 2026-12-07)


def start(
    src: str, extra: dict[str, str], argv: list[str] = PYTHON_SERVE
) -> tuple[subprocess.Popen[str], int]:
    """`argv` (`serve` on any port) from `src`, once it printed serve's ready line: the process
    and its HTTP port."""
    p = subprocess.Popen(argv, env=clean_env(src) | extra, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    assert p.stdout is not None
    for line in p.stdout:
        if m := re.search(SERVING, line):
            # keep draining its output, or the pipe fills and the server blocks
            threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()  # type: ignore[union-attr]
            return p, int(m.group(1))
    raise RuntimeError(f"{argv[-3:]} from {src} ended before it was ready")


def after_burst(
    server: tuple[subprocess.Popen[str], int], queries: list[str]
) -> tuple[subprocess.Popen[str], int]:
    """`server` once it has answered BURST_CLIENTS concurrent clients (its engine thread has
    run batches of several requests)."""
    threads = [
        threading.Thread(target=sequential_us, args=(server[1], queries[k:], BURST_REQUESTS))
        for k in range(BURST_CLIENTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return server


def http_p50s(
    ports: list[int],
    queries: list[Any],
    n: int,
    alone: bool = False,
    turn: int = 0,
    fields: dict[str, Any] | None = None,
) -> list[float]:
    """Each server's p50 (ms) over `n` sequential queries: called in turn, request by request,
    or with `alone` one server after another (the order rotated by `turn`), the others idle.

    NOTE: called in turn, each server's forward runs after the others' forwards have read their
    own copies of the weights through the shared L3 (32 MB here, bf16 MiniLM's layers 21 MB): a
    forward whose weights were evicted is ~1 ms slower (in process, after reading 96 MB between
    queries: 3.86 against 2.88 ms p50; ad-hoc probe, 2026-12-05). In turn compares trees under
    the same drift; only `alone` gives a server's own time, the one to set beside in process."""
    if not alone:
        return [median(us[WARM:]) / 1e3 for us in interleaved_us(ports, queries, n + WARM, fields)]
    p50s = [0.0] * len(ports)
    for k in range(len(ports)):
        j = (turn + k) % len(ports)
        p50s[j] = median(sequential_us(ports[j], queries, n + WARM, fields)[WARM:]) / 1e3
    return p50s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", help="NAME=SRC (a tree's src folder)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE",
        help="a variable in one tree's serve environment (repeatable)",
    )
    ap.add_argument(
        "--burst",
        action="store_true",
        help="a second server per tree, measured after it served concurrent clients once "
        f"({BURST_CLIENTS} x {BURST_REQUESTS} short queries): a server's state after a burst",
    )
    ap.add_argument(
        "--alone",
        action="store_true",
        help="each server measured with the others idle, one after another (the order rotated "
        "each round), instead of request by request in turn: see http_p50s",
    )
    ap.add_argument("--passages", type=int, default=0, help="passages per request (0: a query)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.trees)
    extra: dict[str, dict[str, str]] = {name: {} for name in trees}
    for item in args.env:
        name, assignment = item.split(":", 1)
        key, value = assignment.split("=", 1)
        extra[name][key] = value
    queries: list[Any] = corpus.queries(64)
    if args.passages:
        texts = corpus.passages(8 * args.passages, min_words=20, max_words=120, seed=3)
        queries = [texts[k * args.passages : (k + 1) * args.passages] for k in range(8)]
    servers = {name: start(src, extra[name]) for name, src in trees.items()}
    if args.burst:
        for name, src in trees.items():
            servers[f"{name} after a burst"] = after_burst(start(src, extra[name]), queries)
    first = next(iter(trees))
    results: dict[str, list[float]] = {name: [] for name in servers} | {"in process": []}
    code = IN_PROCESS.format(bench=str(Path(__file__).resolve().parents[1]), warm=WARM,
                             n=args.requests)  # fmt: skip
    try:
        for r in range(args.rounds):
            ports = [port for _, port in servers.values()]
            fields = {"truncate": "end"} if args.passages else None  # a passage may pass 256
            p50s = http_p50s(ports, queries, args.requests, args.alone, r, fields)
            for name, p50 in zip(servers, p50s, strict=True):
                results[name].append(round(p50, 3))
            if not args.passages:
                out = subprocess.run([sys.executable, "-c", code], env=clean_env(trees[first]),
                                     capture_output=True, text=True, check=True)  # fmt: skip
                results["in process"].append(round(float(out.stdout.split()[-1]), 3))
            print(r, {k: v[-1] for k, v in results.items() if v}, flush=True)
    finally:
        for p, _ in servers.values():
            os.killpg(p.pid, signal.SIGTERM)
    what = f"{args.passages} passages" if args.passages else "one short query"
    records = [
        {"system": f"embedserve serve ({name})" if name != "in process" else
         f"embedserve Embedder.encode ({first})", "model": "all-MiniLM-L6-v2", "weights": "real",
         "dtype": "CPU default", "batch": args.passages or 1,
         "tokens": "20-120 words each" if args.passages else "3-12 words", "concurrency": 1,
         "metric": f"{what} p50 (ms), median of rounds", "value": median(values),
         "scope": "HTTP end to end" if name != "in process" else "in process",
         "rounds": values}
        for name, values in results.items() if values
    ]  # fmt: skip
    order = (
        "each alone, one after another, the order rotated by round"
        if args.alone
        else "the servers called in turn"
    )
    notes = (f"{args.rounds} rounds, {args.requests} sequential requests per server per round "
             f"(one keep-alive connection each, {order}), trees: "
             + ", ".join(f"{k}={v}" for k, v in trees.items())
             + "".join(f"; {k} env {v}" for k, v in extra.items() if v)
             + (f"; 'after a burst': a second server of the tree, measured after {BURST_CLIENTS} "
                f"concurrent clients sent it {BURST_REQUESTS} short queries each"
                if args.burst else ""))  # fmt: skip
    _, table = report.write("http-ab", report.cpu_hardware(), f"cpu{os.cpu_count()}", records,
                            report.versions("torch"), notes, args.out)  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
