"""A/B of one short query's `Embedder.encode` in process across two source trees, interleaved: is
a CPU latency change real?

Each round starts one process per tree (the order alternating round by round), each builds the
bundled all-MiniLM-L6-v2 with the CPU defaults, warms up on 100 queries and times `--calls`
`encode([query])` over 64 held-out queries in turn; the process's p50 is that round's figure.
Reported: each tree's median over rounds and the median of the paired differences (new - old).

    git archive OLD src | tar -x -C /tmp/old-tree
    .venv/bin/python benchmarks/studies/encode_ab.py --tree old=/tmp/old-tree/src --tree new=src

Writes results/studies/encode-ab-cpuN-YYYYMMDD.json and .md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report

BENCH = str(Path(__file__).resolve().parents[1])
TIMED = """
import sys, time
sys.path.insert(0, {bench!r})
from harness import corpus
from embedserve import Embedder
e, q = Embedder(), corpus.queries(64)
for i in range(100):
    e.encode([q[i % 64]])
ts = []
for i in range({calls}):
    t = time.perf_counter(); e.encode([q[i % 64]]); ts.append(time.perf_counter() - t)
ts.sort()
print(ts[len(ts) // 2] * 1e3)
"""


def p50_ms(src: str, calls: int) -> float:
    """One fresh process's p50 (ms) with `src` first on its path."""
    env = {**os.environ, "PYTHONPATH": src}
    code = TIMED.format(bench=BENCH, calls=calls)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the timed process failed:\n{done.stderr}")
    return float(done.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=SRC, two of them")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=600)
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    if len(trees) != 2:
        raise SystemExit("give two --tree NAME=SRC, the old first")
    (old, _), (new, _) = trees.items()
    rounds: dict[str, list[float]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
            rounds[name].append(round(p50_ms(trees[name], args.calls), 3))
        print(r, {k: v[-1] for k, v in rounds.items()}, flush=True)
    medians = {k: statistics.median(v) for k, v in rounds.items()}
    paired = statistics.median(b - a for a, b in zip(rounds[old], rounds[new], strict=True))
    doc = {
        "hardware": report.cpu_hardware(), "commit": report.commit(), "date": report.today(),
        "what": "p50 (ms) of one short query's Embedder.encode in process, all-MiniLM-L6-v2, CPU "
                f"defaults, one process per tree and round, {args.calls} calls each",
        "trees": trees, "p50_ms": rounds, "median_ms": medians,
        f"paired_median_ms ({new} - {old})": round(paired, 3),
    }  # fmt: skip
    path = report.write_json(f"encode-ab-cpu{os.cpu_count()}", doc)
    lines = [
        f"# One short query in process, two trees, {doc['hardware']}",
        "",
        f"commit {doc['commit']}, {doc['date']}; {doc['what']}",
        "",
        "| tree | source | p50 ms, median of rounds | rounds |",
        "|---|---|---|---|",
        *(f"| {k} | {trees[k]} | {medians[k]:.3f} | {', '.join(map(str, v))} |"
          for k, v in rounds.items()),
        "",
        f"Paired median ({new} - {old}): {paired:+.3f} ms",
    ]  # fmt: skip
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:]), f"\nwrote {path}")


if __name__ == "__main__":
    main()
