"""`embedserve index` on a local Ray against one `Embedder` process, same records, one run.

20,000 records of real English text (Python standard library docstrings cut into passages of 8
to 180 words, `corpus.passages`), written as 8 jsonl files. Both sides embed them with
all-MiniLM-L6-v2 on the CPU, `truncate="end"` (no record is refused): the baseline is
`Embedder.encode` on all texts in this process (its default batching); `embedserve index` runs
the whole job (Ray start, actor start-up, reading, embedding, Parquet writing) and is timed end
to end. The baseline runs before and after the job (the machine's speed drifts; the ratio is
against their mean, and each is in the notes). The vectors are compared by id (min cosine).
Writes throughput-cpu2-index-<date>.json.

    python benchmarks/studies/index.py [--records 20000] [--files 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--files", type=int, default=8)
    args = ap.parse_args()
    import pyarrow.parquet as pq

    from embedserve.embedder import Embedder

    texts = corpus.passages(args.records, seed=3)
    tmp = Path(tempfile.mkdtemp(prefix="index-bench-"))
    per = -(-len(texts) // args.files)
    for k in range(args.files):
        with (tmp / f"part-{k:02d}.jsonl").open("w", encoding="utf-8") as f:
            for i in range(k * per, min((k + 1) * per, len(texts))):
                f.write(json.dumps({"id": f"r{i}", "text": texts[i]}) + "\n")
    embedder = Embedder("minilm", device="cpu")
    tokens = sum(map(len, embedder.tokenize(texts, truncate="end")))
    embedder.encode(texts[:200], truncate="end")  # warm-up
    t0 = time.perf_counter()
    want = embedder.encode(texts, truncate="end")
    embedder_before_s = time.perf_counter() - t0
    out = tmp / "vectors"
    cmd = [sys.executable, "-m", "embedserve.cli.main", "index", "--input", str(tmp), "--output",
           str(out), "--device", "cpu", "--truncate", "end"]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    index_s = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    t0 = time.perf_counter()
    embedder.encode(texts, truncate="end")
    embedder_after_s = time.perf_counter() - t0
    embedder_s = (embedder_before_s + embedder_after_s) / 2
    got: dict[str, np.ndarray] = {}
    for f in sorted(out.glob("*.parquet")):
        table = pq.read_table(f)
        for id_, v in zip(table["id"].to_pylist(), table["vector"].to_pylist(), strict=True):
            got[id_] = np.asarray(v, dtype=np.float32)
    rows = np.stack([got[f"r{i}"] for i in range(len(texts))])
    cos = (rows * want).sum(1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(want, axis=1))
    again = subprocess.run(cmd, capture_output=True, text=True)
    resumed = json.loads(again.stdout.strip().splitlines()[-1])
    base = dict(model="all-MiniLM-L6-v2", weights="real", dtype="fp32", batch=len(texts),
                tokens="8-180 words", concurrency=1, scope="end_to_end")  # fmt: skip
    records = [
        dict(system="Embedder (one process)", metric="tokens_per_s", value=round(tokens / embedder_s), **base),
        dict(system="Embedder (one process)", metric="records_per_s", value=round(len(texts) / embedder_s, 1), **base),
        dict(system="embedserve index (local Ray, end to end)", metric="tokens_per_s", value=round(tokens / index_s),
             cosine_min=round(float(cos.min()), 7), **base),
        dict(system="embedserve index (local Ray, end to end)", metric="records_per_s",
             value=round(len(texts) / index_s, 1), cosine_min=round(float(cos.min()), 7), **base),
    ]  # fmt: skip
    notes = (
        f"{len(texts)} records ({tokens} tokens after truncation to 256) of Python stdlib "
        f"docstring passages in {args.files} jsonl files; all-MiniLM-L6-v2 fp32 on the CPU, "
        f"truncate end. Embedder.encode in one process: {embedder_before_s:.1f} s before the job, "
        f"{embedder_after_s:.1f} s after it, mean {embedder_s:.1f} s. embedserve index "
        f"end to end (Ray start, actor start-up, reading, embedding, Parquet): {index_s:.1f} s, "
        f"ratio {embedder_s / index_s:.2f} of the Embedder's mean rate ({embedder_before_s / index_s:.2f} "
        f"against the run before, {embedder_after_s / index_s:.2f} after); summary {summary}. "
        f"Min cosine "
        f"by id against the Embedder: {cos.min():.7f}. A second run: {resumed}."
    )
    path, table = report.write(
        "throughput", report.cpu_hardware(), "cpu2-index", records,
        report.versions("torch", "ray", "pyarrow"), notes,
    )  # fmt: skip
    print(notes)
    print(table)
    print(path)


if __name__ == "__main__":
    main()
