"""What bounds float32 on a CPU without native bf16 (issue 39): the floors beside the measured rates.

all-MiniLM-L6-v2 (the bundled real weights), float32, in this process, both cores:

- **the machine**: the read bandwidth over an array of the six layers' fp32 weight bytes (a sum,
  both cores), and the fp32 matrix rate of one FFN-up product (384 -> 1,536) at 2,048 rows
  through `F.linear`;
- **one short query**: the ONNX Runtime executor's session call on one 12-token sequence (the
  path the start-up choice takes for short queries on the CPUs measured so far) and
  `Embedder.encode([query])` around it, p50 of `--calls`; the floors: the weight bytes over the
  bandwidth (every weight read once per forward; the L3 is smaller than the weights on the
  CPUs we rent) and the forward's FLOPs over the matrix rate;
- **a corpus**: the suites' `--corpus` passages (20-180 words), their tokens counted by the
  model's tokenizer; the floor in texts/s at the measured matrix rate, the layers' products and
  attention's score and value products counted (no padding: the engine packs).

    .venv/bin/python benchmarks/studies/cpu_floor_fp32.py [--calls 300] [--corpus 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from studies.cpu_floor import p50_ms, read_bandwidth


def layer_flops(tokens: int, seq_len: int, hidden: int, ffn: int, layers: int) -> float:
    """Multiply-adds x 2 of the layers on `tokens` tokens in sequences of `seq_len`."""
    products = 2 * tokens * (4 * hidden * hidden + 2 * hidden * ffn)
    attention = 2 * 2 * tokens * seq_len * hidden  # scores and values
    return float(layers * (products + attention))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--corpus", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from embedserve import Embedder
    from embedserve.engine import onnx_encoder

    e = Embedder("minilm", device="cpu", dtype="float32", cpu_path="onnx")
    hidden, ffn, layers = 384, 1536, 6
    weight_bytes = layers * 4 * (4 * hidden * hidden + 2 * hidden * ffn)
    rows: dict[str, float] = {}
    with torch.inference_mode():
        rows["read bandwidth at the weights' size, GB/s"] = read_bandwidth(weight_bytes) / 1e9
        x, w, b = torch.randn(2048, hidden), torch.randn(ffn, hidden), torch.randn(ffn)
        mm_ms = p50_ms(lambda: F.linear(x, w, b), 50)
        rows["fp32 matrix rate, F.linear 2048 x 384 -> 1536, GFLOP/s"] = (
            2 * 2048 * hidden * ffn / (mm_ms / 1e3) / 1e9
        )
    rate = rows["fp32 matrix rate, F.linear 2048 x 384 -> 1536, GFLOP/s"] * 1e9
    query = "how do I bake sourdough bread at home"
    ids = e.tokenizer.encode([query])[0]
    n = len(ids)
    session = e.engine.model  # cpu_path "onnx": the engine's forward is the session's
    assert isinstance(session, onnx_encoder.OnnxEncoder), type(session)
    feed = [np.array([ids], dtype=np.int64), np.arange(n, dtype=np.int64)[None] + 2,
            np.zeros((1, n), dtype=np.int64)]  # fmt: skip
    rows[f"ONNX Runtime session, one {n}-token query, ms"] = p50_ms(
        lambda: session._run(feed, np.array([n], dtype=np.int32)), args.calls
    )
    rows[f"Embedder.encode([query]) ({n} tokens), ms"] = p50_ms(
        lambda: e.encode([query]), args.calls
    )
    rows["floor: weight bytes / bandwidth, ms"] = (
        weight_bytes / (rows["read bandwidth at the weights' size, GB/s"] * 1e9) * 1e3
    )
    rows["floor: one query's FLOPs / matrix rate, ms"] = (
        layer_flops(n, n, hidden, ffn, layers) / rate * 1e3
    )
    texts = corpus.passages(args.corpus, max_words=180)
    lengths = [len(t) for t in e.tokenizer.encode(texts, truncate="end")]
    flops = sum(layer_flops(m, m, hidden, ffn, layers) for m in lengths)
    rows["corpus tokens"] = float(sum(lengths))
    rows["corpus floor at the matrix rate, texts/s"] = len(texts) / (flops / rate)
    records = [
        {"system": "embedserve float32 (onnx)", "model": "all-MiniLM-L6-v2", "weights": "real",
         "dtype": "float32", "tokens": n, "batch": 1, "concurrency": 1, "metric": name,
         "value": round(value, 4), "scope": "in process"}
        for name, value in rows.items()
    ]  # fmt: skip
    notes = (
        f"float32, torch threads {torch.get_num_threads()}; the six layers' fp32 weights "
        f"{weight_bytes / 1e6:.1f} MB; {args.corpus} passages of 20-180 words "
        f"({sum(lengths)} tokens). The floors assume every weight is read once per forward at the "
        "measured bandwidth, or every product runs at the measured large-matrix rate."
    )
    _, table = report.write(
        "cpu-floor-fp32", report.cpu_hardware(), f"cpu{os.cpu_count()}", records,
        report.versions("torch", "onnxruntime"), notes, args.out,
    )  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
