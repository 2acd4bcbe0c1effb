"""Sparse / multi-vector outputs through the CUDA graphs against the eager path (issue 26).

One engine with graphs (the default on CUDA: the encoder replayed per bucket, `token_runner`)
and one with `graphs=False`, same folder, same batches; per shape the median of `--reps` calls
of `Engine.encode_outputs` (host time to the answer: the call waits for the device), after
warm-up calls that capture the buckets. Shapes: one short query, 1 x 128, 16 x 128 tokens.
Folders are made beforehand (`embedserve make-checkpoint`, random weights) and named by path.

    PYTHONPATH=src python3 benchmarks/studies/outputs_graphs.py FOLDER [FOLDER ...] --out DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report
from harness.timing import median

SHAPES = ((1, 12), (1, 128), (16, 128))  # (sequences, tokens each)


def batch_of(seqs: int, tokens: int, vocab: int, seed: int):  # type: ignore[no-untyped-def]
    from embedserve.engine.batch import PackedBatch

    rng = np.random.default_rng(seed)
    # ids from 1000 up: clear of every family's special tokens
    return PackedBatch.from_token_lists(
        [rng.integers(1000, vocab, tokens).tolist() for _ in range(seqs)]
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    import torch

    from embedserve.engine.engine import Engine

    records = []
    for folder in args.folders:
        graphs = Engine.from_folder(folder)
        eager = Engine.from_folder(folder, graphs=False)
        outputs = tuple(graphs.retrieval.spec.outputs)  # every output the folder has
        for seqs, tokens in SHAPES:
            batch = batch_of(seqs, tokens, graphs.vocab_size, seed=seqs * tokens)
            for name, engine in (("graphs", graphs), ("eager", eager)):
                for _ in range(3):  # eager, capture, replay
                    engine.encode_outputs(batch, outputs)
                times = []
                for _ in range(args.reps):
                    if engine.device.type == "cuda":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    engine.encode_outputs(batch, outputs)
                    times.append(time.perf_counter() - start)
                records.append(
                    {
                        "system": f"embedserve encode_outputs ({name})",
                        "model": folder.name,
                        "weights": "random",
                        "dtype": engine.dtype_name,
                        "batch": seqs,
                        "tokens": tokens,
                        "concurrency": 1,
                        "metric": "p50 (ms)",
                        "value": round(median(times) * 1e3, 3),
                        "scope": f"outputs {','.join(outputs)}, host time, waits for the device",
                    }
                )
                print(records[-1]["model"], name, seqs, tokens, records[-1]["value"], flush=True)
        print(folder.name, "stats (graphs engine):", graphs.stats, flush=True)
    _, table = report.write(
        "retrieval",
        torch.cuda.get_device_name() if torch.cuda.is_available() else report.cpu_hardware(),
        report.card_slug() + "-outputs-graphs",
        records,
        report.versions("torch"),
        "encode_outputs with the encoder through the CUDA graphs vs eager, same engine settings",
        args.out,
    )
    print(table)


if __name__ == "__main__":
    main()
