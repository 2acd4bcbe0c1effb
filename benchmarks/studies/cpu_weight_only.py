"""Weight-only quantization of our ONNX graph (ONNX Runtime's MatMulNBits) against float32, for
one short query on a CPU without VNNI (issue 39): is the query bound by streaming the weights?

If it were, weights of 8 or 4 bits would make the products faster while their compute stays
float32 (accuracy level 1) or becomes int8 (level 4). Each variant is the engine's own cached graph
with every MatMul quantized by `MatMulNBitsQuantizer` (block 32, symmetric); the fused Attention
op's QKV product and the embeddings stay float32. Fidelity is the least cosine of the mean-pooled,
normalized vector against the float32 graph's over 64 held-out queries.

Needs `onnx-ir` beside onnxruntime (the quantizer imports it; it is not a dependency of ours):

    .venv/bin/pip install onnx-ir   # or: pip install --target DIR onnx-ir; PYTHONPATH=DIR
    .venv/bin/python benchmarks/studies/cpu_weight_only.py [--rounds 2] [--calls 320]

Writes results/studies/weight-only-cpuN-YYYYMMDD.json and .md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report
from harness.onnx_feeds import lone_feed, onnx_queries

from embedserve.engine import onnx_encoder

# (bits, accuracy level): level 1 computes in float32, level 4 in int8
VARIANTS = {"8-bit weights, fp32 compute": (8, 1), "8-bit weights, int8 compute": (8, 4),
            "4-bit weights, fp32 compute": (4, 1)}  # fmt: skip


def quantized(graph: Path, bits: int, level: int, out: Path) -> Path:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(
        onnx.load(str(graph)), bits=bits, block_size=32, is_symmetric=True, accuracy_level=level
    )
    q.process()
    q.model.save_model_to_file(str(out), use_external_data_format=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calls", type=int, default=320)
    args = ap.parse_args()
    _, model, _, ids = onnx_queries()
    graph = Path(model.path)  # the cached graph this process serves
    feeds = [lone_feed(x, model.position_offset) for x in ids]
    # every graph under the engine's own session settings (`onnx_encoder.session`), the
    # float32 one in a session of its own like the others
    threads = model.num_threads
    sessions: dict[str, Any] = {
        "float32 (the engine's graph)": onnx_encoder.session(graph, threads)
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, (bits, level) in VARIANTS.items():
            path = quantized(graph, bits, level, Path(tmp) / f"q{bits}-{level}.onnx")
            sessions[name] = onnx_encoder.session(path, threads)

    def vector(session: Any, feed: dict[str, np.ndarray]) -> np.ndarray:
        v = session.run(["hidden"], feed)[0][0].mean(axis=0)
        return v / np.linalg.norm(v)

    ref = [vector(sessions["float32 (the engine's graph)"], f) for f in feeds]
    rows: dict[str, dict[str, Any]] = {}
    for r in range(args.rounds):
        for name, session in sessions.items():
            for f in feeds[:16]:
                session.run(["hidden"], f)
            times = []
            for i in range(args.calls):
                t = time.perf_counter()
                session.run(["hidden"], feeds[i % 64])
                times.append(time.perf_counter() - t)
            row = rows.setdefault(name, {"p50_ms": []})
            row["p50_ms"].append(round(statistics.median(times) * 1e3, 3))
            row["cosine_min"] = round(
                min(float(vector(session, f) @ ref[i]) for i, f in enumerate(feeds)), 6
            )
            print(r, name, row["p50_ms"][-1], "ms, least cosine", row["cosine_min"], flush=True)
    doc = {
        "hardware": report.cpu_hardware(), "commit": report.commit(), "date": report.today(),
        "onnxruntime": ort.__version__, "threads": threads,
        "what": "p50 (ms) of one ONNX Runtime run of a short query (all-MiniLM-L6-v2 real "
                f"weights, 64 held-out queries in turn, {args.calls} calls a round), each MatMul "
                "of the engine's graph quantized by MatMulNBits (block 32, symmetric)",
        "variants": rows, "rounds": args.rounds,
    }  # fmt: skip
    path = report.write_json(f"weight-only-cpu{os.cpu_count()}", doc)
    lines = [
        f"# Weight-only quantization, one short query, {doc['hardware']}",
        "",
        f"commit {doc['commit']}, {doc['date']}, onnxruntime {ort.__version__}; {doc['what']}",
        "",
        "| graph | p50 ms (each round) | least cosine to float32 |",
        "|---|---|---|",
        *(f"| {k} | {', '.join(map(str, v['p50_ms']))} | {v['cosine_min']:.6f} |" for k, v in rows.items()),
    ]  # fmt: skip
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:]), f"\nwrote {path}")


if __name__ == "__main__":
    main()
