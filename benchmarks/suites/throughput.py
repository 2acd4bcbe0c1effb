"""Offline bulk throughput: `Embedder.encode` of 1,000 passages with default settings, beside
sentence-transformers `encode` tuned as its documentation advises (half precision, the best of
several batch sizes; it sorts inputs by length itself), on the same passages in one run.

Also reports our engine alone on the same token ids (`embed_ids`: no tokenization) and how the
default run used the CUDA graphs (replays vs eager runs), the point of the default batch budget.

Text: Python standard-library docstrings (benchmarks/corpus.py).

    PYTHONPATH=src python3 benchmarks/encode_gpu.py --model DIR [--out DIR] [--count 1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report


def timed(fn: Any, repeats: int) -> list[float]:
    import torch

    out = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="all-MiniLM-L6-v2 folder (fp16 copy)")
    parser.add_argument("--out", type=Path, default=report.RESULTS)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    from embedserve.embedder import Embedder

    device = "cuda" if torch.cuda.is_available() else "cpu"
    texts = corpus.passages(args.count)
    ours = Embedder(args.model, device=device)
    num_tokens = sum(map(len, ours.tokenize(texts, truncate="end")))
    ours.encode(texts, truncate="end")  # first sight of each bucket: eager
    ours.encode(texts, truncate="end")  # second: captured
    stats = ours.engine.stats
    replays0, eager0 = stats.replays, stats.eager_runs
    encode_s = timed(lambda: ours.encode(texts, truncate="end"), args.repeats)
    replays = (stats.replays - replays0) // args.repeats
    eager = (stats.eager_runs - eager0) // args.repeats
    ids = ours.tokenize(texts, truncate="end")
    budget = ours._batch_tokens(None)
    ids_s = timed(lambda: ours.embed_ids(ids, batch_tokens=budget), args.repeats)
    vectors = ours.encode(texts, truncate="end")

    st_dtype = torch.float16 if device == "cuda" else torch.float32
    st = SentenceTransformer(args.model, device=device, model_kwargs={"torch_dtype": st_dtype})
    best: tuple[float, int] = (float("inf"), 0)
    for batch_size in (64, 128, 256):
        st.encode(texts, batch_size=batch_size)
        t = statistics.median(timed(lambda b=batch_size: st.encode(texts, batch_size=b), 3))
        best = min(best, (t, batch_size))
    reference = st.encode(texts, batch_size=best[1], normalize_embeddings=True)
    cosine = float(np.min(np.sum(vectors * reference, axis=1)))

    hardware = torch.cuda.get_device_name() if device == "cuda" else report.cpu_hardware()
    common = {
        "model": "all-MiniLM-L6-v2",
        "weights": "real",
        "batch": args.count,
        "tokens": "passages",
        "concurrency": 1,
        "metric": "tokens_per_s",
    }
    records = [
        {
            **common,
            "system": "embedserve Embedder.encode (defaults)",
            "dtype": str(ours.engine.dtype).removeprefix("torch."),
            "value": num_tokens / statistics.median(encode_s),
            "scope": "end_to_end",
            "cosine_min": cosine,
            "graph_replays": replays,
            "eager_runs": eager,
            "batch_tokens": budget,
        },
        {
            **common,
            "system": "embedserve Embedder.embed_ids (token ids in)",
            "dtype": str(ours.engine.dtype).removeprefix("torch."),
            "value": num_tokens / statistics.median(ids_s),
            "scope": "engine",
        },
        {
            **common,
            "system": f"sentence-transformers encode (batch_size={best[1]})",
            "dtype": str(st_dtype).removeprefix("torch."),
            "value": num_tokens / best[0],
            "scope": "end_to_end",
        },
    ]
    notes = (
        f"{args.count} passages ({num_tokens} tokens, Python standard-library docstrings), "
        f"median of {args.repeats} runs after two warm-up runs (eager, then capture). Ours per "
        f"run: {replays} graph replays, {eager} eager runs at the default batch budget of "
        f"{budget} tokens. sentence-transformers: the best of batch sizes 64/128/256 in "
        f"{'fp16' if device == 'cuda' else 'fp32'} (median of 3 each); it sorts by length itself."
    )
    slug = "h200" if "H200" in hardware else "cpu"
    _, table = report.write(
        "throughput",
        hardware,
        slug,
        records,
        report.versions("torch", "transformers", "sentence-transformers"),
        notes,
        args.out,
    )
    print(notes)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
