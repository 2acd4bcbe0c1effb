"""A reranker's request core before the model (issue 55's rerank row): one query paired with N
documents of ~508-token pairs (the ms-marco MiniLM cross-encoder shape, the bundled MiniLM's BERT
tokenizer), in one run:

- native: `PairPreparer.prepare`, the pairs joined by the tokenizer's pair template from the
  native tokenizer's ids of each text (`embedserve._native.PairTemplate`);
- package: the Python `tokenizers` package's pair encoding (`encode_batch_fast` of the (query,
  document) pairs, each pair's ids and sequence ids read out), what the request core did before
  and what a Hugging Face fast tokenizer does; its ids are checked equal to ours;
- HTTP: `embedserve serve --native` in front of the null engine (`harness/null_engine.py`: every
  pair scored at once), `POST /v1/rerank`, keep-alive, p50: the request path alone; the plain
  body (documents as strings: answered by Ivy, natively) and the same documents as
  `{"text": ...}` objects (handed to the Python front in the same process: its pipeline).

    PYTHONPATH=src python3 benchmarks/studies/pair_prepare.py [--counts 1,5,25,50] [--out DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report, timing
from harness.servers import harness_call, start
from suites.scoring import QUERY, documents

from embedserve import Scorer
from embedserve.devtools.checkpoints import make_checkpoint

ARCH = "ms-marco-minilm-l6"


def median_ms(fn: Any, reps: int) -> float:
    return timing.median(timing.timed_ms(fn, reps, "cpu"))


def package_pairs(scorer: Any, docs: list[str]) -> list[list[int]]:
    """The package's pair encoding, each pair's ids and sequence ids read out (as the request
    core read them to find the document); the ids returned."""
    encodings = scorer.pairs.tokenizer._full.encode_batch_fast([(QUERY, d) for d in docs])
    read = [(list(e.ids), list(e.sequence_ids)) for e in encodings]
    return [ids for ids, _ in read]


def http_ms(port: int, docs: list[str], reps: int, objects: bool = False) -> float:
    """`/v1/rerank`'s p50; `objects`: the documents as `{"text": ...}` objects, a shape Ivy
    hands to the Python front."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    sent: list[Any] = [{"text": d} for d in docs] if objects else docs
    body = json.dumps({"model": "rr", "query": QUERY, "documents": sent})

    def once() -> None:
        conn.request("POST", "/v1/rerank", body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        data = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {data[:300]!r}")

    return median_ms(once, reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--counts", default="1,5,25,50")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    folder = make_checkpoint(Path(tempfile.mkdtemp()) / "rr", arch=ARCH, dtype="float32", seed=0)
    scorer = Scorer(folder, device="cpu")
    all_docs = documents(scorer, max(counts))
    server, ready = start(harness_call("null_engine:serve_native_null", str(folder), "0", "rr"),
                          r"serving \S+ at http://127\.0\.0\.1:(\d+)")  # fmt: skip
    records: list[dict[str, Any]] = []
    try:
        for n in counts:
            docs = all_docs[:n]
            ours = scorer.pairs.prepare(QUERY, docs).seqs
            assert ours == package_pairs(scorer, docs), "the pair ids differ from the package's"
            tokens = sum(map(len, ours))
            row = {
                "embedserve PairPreparer.prepare (native ids, pair template)": median_ms(
                    lambda d=docs: scorer.pairs.prepare(QUERY, d), args.reps
                ),
                "tokenizers package encode_batch_fast of the pairs": median_ms(
                    lambda d=docs: package_pairs(scorer, d), args.reps
                ),
                "embedserve serve --native HTTP /v1/rerank, null engine, Ivy": http_ms(
                    int(ready.group(1)), docs, args.reps
                ),
                "embedserve serve --native HTTP /v1/rerank, null engine, Python front": http_ms(
                    int(ready.group(1)), docs, args.reps, objects=True
                ),
            }
            for system, value in row.items():
                records.append({"system": system, "model": "ms-marco-MiniLM-L-6-v2 shape",
                                "weights": "random", "dtype": "none", "batch": n,
                                "tokens": f"{tokens} in all", "concurrency": 1,
                                "metric": "p50_ms", "value": round(value, 3), "scope": "host"})  # fmt: skip
            print(n, tokens, [round(v, 3) for v in row.values()], flush=True)
    finally:
        server.stop()
    notes = (f"One query ({QUERY!r}) against N documents, pairs of about 508 tokens (real text); "
             f"median of {args.reps} calls in one process, then over HTTP with a keep-alive "
             "client. The package row's ids are checked equal to ours.")  # fmt: skip
    slug = f"cpu{os.cpu_count()}" if (os.cpu_count() or 0) <= 4 else f"host{os.cpu_count()}"
    _, table = report.write("pair-prepare", report.cpu_hardware(), slug, records,
                            report.versions("tokenizers"), notes, args.out)  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
