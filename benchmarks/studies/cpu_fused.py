"""The packed CPU products' post-ops (`Linear.plus`, `Linear.activated`) against the same products
followed by separate operators, in one process, called in turn.

all-MiniLM-L6-v2 (the bundled real weights) at the CPU default (bf16, weights packed for
oneDNN). The fused engine is the code as it is; the unfused one is the same engine with each
`Linear`'s `plus` and `activated` replaced by the product followed by the separate add or GELU
(what BertLayer ran before the post-ops). Measured: `Embedder.encode([query])` p50 of the
suites' short queries, the two engines called in turn query by query (the order alternated),
`--rounds` rounds; each engine's least cosine to the fp32 model over held-out queries and
passages (the guard asks 0.999).

    .venv/bin/python benchmarks/studies/cpu_fused.py [--calls 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report


def unfused(embedder: Any) -> Any:
    """`embedder` with every packed product's post-ops run as separate operators instead."""
    from embedserve.engine.layers.linear import Linear

    for m in embedder.engine.model.modules():
        if isinstance(m, Linear):
            m.plus = lambda x, residual, m=m: m(x) + residual
            m.activated = lambda x, act, m=m: act(m(x))
    return embedder


def main() -> None:
    from embedserve import Embedder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--texts", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    engines = {
        "post-ops fused": Embedder("minilm"),
        "separate operators": unfused(Embedder("minilm")),
    }
    texts = corpus.queries(args.texts // 2) + corpus.passages(args.texts - args.texts // 2)
    reference = Embedder("minilm", dtype="float32").encode(texts, truncate="end")
    least = {
        name: float(np.min(np.sum(e.encode(texts, truncate="end") * reference, axis=1)))
        for name, e in engines.items()
    }
    queries = corpus.queries(256)
    for e in engines.values():
        for q in queries[:50]:
            e.encode([q])
    records: list[dict[str, Any]] = []
    names = list(engines)
    for round_ in range(args.rounds):
        times: dict[str, list[float]] = {name: [] for name in names}
        for i in range(args.calls):
            for name in names if i % 2 else names[::-1]:
                t = time.perf_counter()
                engines[name].encode([queries[i % len(queries)]])
                times[name].append(time.perf_counter() - t)
        p50 = {name: float(np.median(t) * 1e3) for name, t in times.items()}
        print(f"round {round_}: " + ", ".join(f"{n} {v:.3f} ms" for n, v in p50.items()))
        for name in names:
            records.append({
                "system": f"embedserve bf16, {name}", "model": "all-MiniLM-L6-v2",
                "weights": "real", "tokens": "3-12 words", "concurrency": 1, "round": round_,
                "metric": "one short query p50, in turn (ms)", "value": round(p50[name], 3),
                "scope": "in process, tokenize included", "cosine_min": round(least[name], 6),
            })  # fmt: skip
    notes = (
        f"{args.rounds} rounds of {args.calls} short queries per engine, the two engines called "
        f"in turn in one process (torch threads: {torch.get_num_threads()}); cosine_min: each "
        f"engine's least cosine to the fp32 model over {args.texts} held-out queries and passages."
    )
    _, table = report.write(
        "cpu-fused", report.cpu_hardware(), f"cpu{os.cpu_count()}", records,
        report.versions("torch"), notes, args.out,
    )  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
