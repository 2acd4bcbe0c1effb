"""A float32 CPU's corpus rate by batch size: which `batch_tokens` a CPU without bf16 wants.

all-MiniLM-L6-v2 (the bundled real weights), float32, in this process, both cores. The engine's
CPU batch budget (`engine.CPU_BATCH_TOKENS`, 2,048) was set on a bf16 CPU; a float32 batch's
activations are twice as large ([2,048, 1,536] fp32 FFN rows: 12.6 MB against an L3 of 16 MiB on
a Zen 2). Each executor (`cpu_path`: the start-up choice, and each path pinned) embeds the same
passages (20-180 words, as the CPU suite's corpus) with `Embedder.encode(texts,
batch_tokens=N)` for each N, the sizes and executors in turn, `--rounds` rounds; the best round
per cell is reported (texts/s), with every round in the JSON. Texts over the model's 256
tokens keep their beginning (`truncate="end"`).

    .venv/bin/python benchmarks/studies/cpu_batch_tokens.py [--corpus 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report

SIZES = (256, 512, 1024, 2048, 4096)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paths", default="auto,packed,onnx")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from embedserve import Embedder

    texts = corpus.passages(args.corpus, min_words=20, max_words=180, seed=3)
    sizes = [int(s) for s in args.sizes.split(",")]
    embedders = {}
    for path in args.paths.split(","):
        e = Embedder("minilm", device="cpu", dtype="float32", cpu_path=path)
        e.encode(texts[:64], truncate="end")  # warm
        embedders[f"{path} ({e.engine.cpu_path})" if path == "auto" else path] = e
    tokens = sum(
        len(t) for t in next(iter(embedders.values())).tokenizer.encode(texts, truncate="end")
    )
    rates: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for name, e in embedders.items():
            for size in sizes:
                t = time.perf_counter()
                e.encode(texts, batch_tokens=size, truncate="end")
                rates.setdefault((name, size), []).append(len(texts) / (time.perf_counter() - t))
    records = [
        {"system": f"embedserve float32, cpu path {name}", "model": "all-MiniLM-L6-v2",
         "weights": "real", "dtype": "float32", "batch": f"batch_tokens {size}",
         "tokens": "20-180 words", "concurrency": 1, "metric": "corpus (texts/s), best round",
         "value": round(max(r), 2), "rounds": [round(x, 2) for x in r], "scope": "in process"}
        for (name, size), r in rates.items()
    ]  # fmt: skip
    isa = report.cpu_isa()
    notes = (
        f"float32, torch threads {torch.get_num_threads()}; {len(texts)} passages of 20-180 "
        f"words ({tokens} tokens); {args.rounds} rounds, the executors and sizes in turn; the "
        "best round per cell (every round in the JSON)."
    )
    hardware = f"{report.cpu_hardware()}; flags: {' '.join(isa) or 'unknown'}"
    path, table = report.write(
        "cpu-batch-tokens", hardware, f"cpu{os.cpu_count()}", records,
        report.versions("torch", "onnxruntime"), notes, args.out,
    )  # fmt: skip
    print(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
