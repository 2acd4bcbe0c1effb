"""Duplicate inputs computed once (issue 56): `Embedder.encode` of a corpus in which 30% of the
rows repeat earlier ones, with each distinct sequence embedded once (`core.duplicates`, what
`encode` does) and with every row embedded (the collapsing turned off), in turn, `--rounds`
times; texts/s, tokens/s of all rows and of the unique work, the speed-up; the vectors checked
equal (fp32: 2e-6) between the two ways.

    PYTHONPATH=src python3 benchmarks/studies/duplicates.py [--texts 600] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report

from embedserve import embedder as embedder_module

DUPLICATE_SHARE = 0.30


def dataset(count: int) -> list[str]:
    """`count` rows: 70% distinct passages, 30% copies of them placed at random."""
    distinct = corpus.passages(round(count * (1 - DUPLICATE_SHARE)), max_words=180)
    rng = random.Random(56)
    rows = distinct + [rng.choice(distinct) for _ in range(count - len(distinct))]
    rng.shuffle(rows)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--texts", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    args = ap.parse_args()
    from embedserve.embedder import Embedder

    texts = dataset(args.texts)
    embedder = Embedder(args.model, device=args.device)
    tokens = [len(s) for s in embedder.inputs.tokenizer.encode(texts, truncate="end")]
    unique_tokens = sum(len(s) for s in {tuple(s) for s in
                                          embedder.inputs.tokenizer.encode(texts, truncate="end")})  # fmt: skip
    collapse = embedder_module.unique_sequences

    def every_row(seqs: Any) -> tuple[Any, None]:
        return list(seqs), None

    ways = {"collapsed": collapse, "every row": every_row}
    embedder.encode(texts[:32], truncate="end")  # warm-up
    times: dict[str, list[float]] = {w: [] for w in ways}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(args.rounds):
        for way, fn in ways.items():
            embedder_module.unique_sequences = fn  # type: ignore[assignment]
            start = time.perf_counter()
            vectors[way] = embedder.encode(texts, truncate="end")
            times[way].append(time.perf_counter() - start)
    embedder_module.unique_sequences = collapse
    diff = float(np.abs(vectors["collapsed"] - vectors["every row"]).max())
    records = []
    for way, t in times.items():
        seconds = statistics.median(t)
        for metric, value in {"seconds": seconds, "texts_per_s": len(texts) / seconds,
                              "tokens_per_s": sum(tokens) / seconds,
                              "unique_tokens_per_s": unique_tokens / seconds}.items():  # fmt: skip
            records.append({
                "system": f"embedserve Embedder.encode, {way}", "model": "all-MiniLM-L6-v2",
                "weights": "real", "dtype": str(embedder.engine.dtype).replace("torch.", ""),
                "batch": len(texts), "tokens": f"{sum(tokens)} ({unique_tokens} unique)",
                "concurrency": 1, "metric": metric, "value": round(value, 3),
                "scope": "in_process",
            })  # fmt: skip
    speedup = statistics.median(times["every row"]) / statistics.median(times["collapsed"])
    notes = (
        f"{len(texts)} passages, {DUPLICATE_SHARE:.0%} of them copies of others (seed 56); "
        f"median of {args.rounds} alternating rounds; speed-up {speedup:.2f}x; the largest "
        f"difference between the two ways' vectors {diff:.2e}. {os.cpu_count()} cores."
    )
    _, table = report.write(
        "duplicates", report.cpu_hardware(), "cpu2" if os.cpu_count() == 2 else "cpu", records,
        report.versions("torch", "onnxruntime"), notes, args.out,
    )  # fmt: skip
    print(table)
    print(notes)


if __name__ == "__main__":
    main()
