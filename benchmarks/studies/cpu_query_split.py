"""Where one short query's time goes on a float32 CPU served by ONNX Runtime (issue 39): the whole
`Embedder.encode`, the engine's step, the session's run on the same ids, the step with the run
replaced by a ready answer, and mean pooling warm against right after a run (torch's `pool`, and
`pool_host`, what ONNX Runtime's steps pool with since 512e775).

The query target (0.8x fastembed's time) is bounded by the session's run, which fastembed pays
too; this says how much of ours is the run and how much the Python around it, and that the work
after a run pays for the caches the run emptied (MiniLM's weights are 90 MB).

    .venv/bin/python benchmarks/studies/cpu_query_split.py [--rounds 3] [--calls 600]

Writes results/studies/query-split-cpuN-YYYYMMDD.json and .md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report
from harness.onnx_feeds import lone_feed, onnx_queries

from embedserve.engine.batch import PackedBatch
from embedserve.engine.pooler.pooling import pool, pool_host


def p50_us(
    call: Callable[[int], Any], calls: int, before: Callable[[], Any] | None = None
) -> float:
    """The median of `calls` timed calls (query i % 64), `before` run untimed ahead of each."""
    for i in range(64):
        call(i % 64)
    times = []
    for i in range(calls):
        if before is not None:
            before()
        t = time.perf_counter()
        call(i % 64)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


class ReadyAnswer:
    """A session stand-in that answers at once: the step's own work without the run."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.ones((*feed["input_ids"].shape, 384), dtype=np.float32)]

    def get_outputs(self) -> Any:
        return self.session.get_outputs()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=600)
    args = ap.parse_args()
    embedder, model, queries, ids = onnx_queries()
    batches = [PackedBatch.from_token_lists([x]) for x in ids]
    feeds = [lone_feed(x, model.position_offset) for x in ids]
    session = model.session
    hidden = torch.randn(len(ids[0]), 384)
    cu = torch.tensor([0, len(ids[0])], dtype=torch.int32)
    seq_ids = torch.zeros(len(ids[0]), dtype=torch.int64)
    hidden_np, cu_np = hidden.numpy(), cu.numpy()

    def one_run() -> None:
        session.run(["hidden"], feeds[0])

    rows: dict[str, list[float]] = {}
    for r in range(args.rounds):
        model.session = session
        measured = {
            "Embedder.encode([query])": p50_us(lambda i: embedder.encode([queries[i]]), args.calls),
            "Engine.step": p50_us(lambda i: embedder.engine.step(batches[i]).wait(), args.calls),
            "session.run alone": p50_us(lambda i: session.run(["hidden"], feeds[i]), args.calls),
            "torch mean pooling, warm": p50_us(
                lambda i: pool(hidden, cu, seq_ids, "mean"), args.calls
            ),
            "torch mean pooling, right after a run": p50_us(
                lambda i: pool(hidden, cu, seq_ids, "mean"), args.calls // 2, one_run
            ),
            # what ONNX Runtime's steps pool with since 512e775
            "NumPy mean pooling (pool_host), warm": p50_us(
                lambda i: pool_host(hidden_np, cu_np, "mean"), args.calls
            ),
            "NumPy mean pooling (pool_host), right after a run": p50_us(
                lambda i: pool_host(hidden_np, cu_np, "mean"), args.calls // 2, one_run
            ),
        }
        model.session = ReadyAnswer(session)
        measured["Engine.step, the run answered at once"] = p50_us(
            lambda i: embedder.engine.step(batches[i]).wait(), args.calls
        )
        for k, v in measured.items():
            rows.setdefault(k, []).append(round(v, 1))
        print(r, {k: v[-1] for k, v in rows.items()}, flush=True)
    model.session = session
    medians = {k: statistics.median(v) for k, v in rows.items()}
    doc = {
        "hardware": report.cpu_hardware(), "commit": report.commit(), "date": report.today(),
        "cpu_path": embedder.engine.cpu_path, "threads": torch.get_num_threads(),
        "tokens_mean": float(np.mean([len(x) for x in ids])),
        "what": "p50 (us) of one short query's pieces, all-MiniLM-L6-v2 real weights, float32 on "
                f"ONNX Runtime, 64 held-out queries in turn, {args.calls} calls per piece and round",
        "p50_us": rows, "median_us": medians, "rounds": args.rounds,
    }  # fmt: skip
    path = report.write_json(f"query-split-cpu{os.cpu_count()}", doc)
    lines = [
        f"# One short query's time, {doc['hardware']}",
        "",
        f"commit {doc['commit']}, {doc['date']}; {doc['what']}; {args.rounds} rounds",
        "",
        "| piece | p50 us (median of rounds) | rounds |",
        "|---|---|---|",
        *(f"| {k} | {medians[k]:.1f} | {', '.join(map(str, v))} |" for k, v in rows.items()),
    ]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:]), f"\nwrote {path}")


if __name__ == "__main__":
    main()
