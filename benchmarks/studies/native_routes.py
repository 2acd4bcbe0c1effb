"""The routes Ivy answers beyond plain embeddings (issue 55), each beside the Python front on the
same server and the in-process floor, in one run, with the real CPU engine (random weights in
the published shapes, float32):

- a SPLADE model (`splade-minilm-l6` shape): TEI's `POST /embed_sparse`, 1 query and 8
  passages; the plain body answered by Ivy, the same body with `"truncation_direction":
  "Right"` (the same answer) handed to the Python front; in process, `Embedder.encode_outputs`;
- a cross-encoder (`ms-marco-minilm-l6` shape): TEI's `POST /rerank` of 1 query against 1 and
  10 passages; documents as strings answered by Ivy, as `{"text": ...}` objects by the Python
  front; in process, `Scorer.score`.

p50 of `--reps` requests, one keep-alive connection, after 3 unmeasured ones.

    PYTHONPATH=src python3 benchmarks/studies/native_routes.py [--reps 50] [--out DIR]
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
from harness import corpus, report, timing
from harness.servers import serve

from embedserve import Embedder, Scorer
from embedserve.devtools.checkpoints import make_checkpoint


def http_ms(port: int, path: str, body: dict[str, Any], reps: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = json.dumps(body)

    def once() -> None:
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        answer = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {answer[:300]!r}")

    return timing.median(timing.timed_ms(once, reps, "cpu", warm=3))


def measure(arch: str, cases: list[tuple[str, str, dict, dict, Any]], reps: int) -> list[dict]:
    """Each case (label, path, Ivy's body, the Python front's body, the in-process call) on a
    `serve --native` of a random-weight `arch` folder: its three p50s."""
    folder = make_checkpoint(Path(tempfile.mkdtemp()) / arch, arch=arch, dtype="float32", seed=0)
    offline = (Embedder if "splade" in arch else Scorer)(folder, device="cpu", dtype="float32")
    child, port = serve("--native", "--model", f"m={folder}", "--device", "cpu",
                        "--dtype", "float32")  # fmt: skip
    rows = []
    try:
        for label, path, ivy, python, in_process in cases:
            row = {
                "in process": timing.median(
                    timing.timed_ms(lambda f=in_process: f(offline), reps, "cpu", warm=3)
                ),
                "serve --native, Ivy": http_ms(port, path, ivy, reps),
                "serve --native, the Python front": http_ms(port, path, python, reps),
            }
            print(arch, label, {k: round(v, 3) for k, v in row.items()}, flush=True)
            for system, value in row.items():
                rows.append({"system": f"{system}: {path}", "model": f"{arch} shape",
                             "weights": "random", "dtype": "float32", "batch": label,
                             "concurrency": 1, "metric": "p50_ms", "value": round(value, 3),
                             "scope": "host"})  # fmt: skip
    finally:
        child.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    args = ap.parse_args()
    query, passages = corpus.queries(1)[0], corpus.passages(32)
    right = {"truncation_direction": "Right"}
    sparse = [
        ("1 query", "/embed_sparse", {"inputs": query}, {"inputs": query, **right},
         lambda e: e.encode_outputs([query])),
        ("8 passages", "/embed_sparse", {"inputs": passages[:8]},
         {"inputs": passages[:8], **right},
         lambda e: e.encode_outputs(passages[:8])),
    ]  # fmt: skip
    rerank = [
        (f"1 query x {n} passages", "/rerank", {"query": query, "texts": passages[:n]},
         {"query": query, "texts": [{"text": p} for p in passages[:n]]},
         lambda s, n=n: s.score(query, passages[:n]))
        for n in (1, 10)
    ]  # fmt: skip
    records = measure("splade-minilm-l6", sparse, args.reps)
    records += measure("ms-marco-minilm-l6", rerank, args.reps)
    notes = (f"p50 of {args.reps} requests on one keep-alive connection (3 unmeasured first); "
             "the server and this client share the machine's cores. Ivy answers the plain "
             "bodies; the Python front the same requests in a shape Ivy hands over (same "
             "answers: tests/native).")  # fmt: skip
    slug = f"cpu{os.cpu_count()}" if (os.cpu_count() or 0) <= 4 else f"host{os.cpu_count()}"
    _, table = report.write("native-routes", report.cpu_hardware(), slug, records,
                            report.versions("torch", "tokenizers"), notes, args.out)  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
