"""The tokenizer's own rate, the floor of bulk embedding on a fast GPU (issues 38, 55): tokens/s
of `TextTokenizer.encode` (what the gateway and `Embedder` call) on 1,000 passages, truncate
"end", through the native tokenizer (`embedserve._native`: the `tokenizers` crate with its
WordPiece twin for clean ASCII, the GIL released, rayon's threads for a large batch) and
through the Python package's `encode_batch_fast` under the same rules (`package`), at several
sizes of the thread pool (`RAYON_NUM_THREADS`, read once when the pool starts: each size in a
process of its own). The ways are interleaved, `--rounds` times, and the medians given; the ids
are checked equal.

    PYTHONPATH=src python3 benchmarks/studies/tokenizer_rate.py --model DIR [--threads 1,4,16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report


def one_pool(model: Path, rounds: int) -> dict[str, float]:
    """In this process (its pool already sized): tokens/s of the request core through the native
    tokenizer (`native`) and through the Python package (`package`)."""
    from embedserve.core.tokenization import TextTokenizer

    texts = corpus.passages(1000, max_words=180)
    native = TextTokenizer(model / "tokenizer.json", 256)
    package = TextTokenizer(model / "tokenizer.json", 256)
    package._ids = lambda tok, t: [e.ids for e in tok.encode_batch_fast(t)]  # type: ignore[method-assign]
    ids = package.encode(texts, truncate="end")
    assert native.encode(texts, truncate="end") == ids, "the native tokenizer changed the ids"
    tokens = sum(map(len, ids))
    ways = {"native": native, "package": package}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, tok in ways.items():
            t0 = time.perf_counter()
            tok.encode(texts, truncate="end")
            times[name].append(time.perf_counter() - t0)
    return {
        "tokens": tokens,
        **{f"{k}_tokens_per_s": tokens / statistics.median(v) for k, v in times.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, required=True, help="a model folder (tokenizer.json)")
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}", help="pool sizes, e.g. 1,4,16")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--machine", default="cpu", help="the file name's machine (h200host there)")
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child's run
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_pool(args.model, args.rounds)))
        return
    rows: list[dict[str, Any]] = []
    for n in (int(x) for x in args.threads.split(",")):
        env = {**os.environ, "RAYON_NUM_THREADS": str(n)}
        child = [sys.executable, __file__, "--model", str(args.model), "--rounds",
                 str(args.rounds), "--one"]  # fmt: skip
        done = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
        rows.append({"threads": n, **json.loads(done.stdout.strip().splitlines()[-1])})
        print(rows[-1], flush=True)
    hardware = report.cpu_hardware()
    doc = {"suite": "tokenizer-rate", "hardware": hardware, "cpu_flags": report.cpu_flags(),
           "commit": report.commit(), "date": report.today(), "model": str(args.model.name),
           "what": "TextTokenizer.encode of 1,000 passages, truncate end; median of the rounds",
           "rounds": args.rounds, "software": report.versions("tokenizers"), "rows": rows}  # fmt: skip
    path = report.write_json(f"tokenizer-rate-{args.machine}{os.cpu_count()}", doc, args.out)
    table = ["| pool threads | tokens | package, tokens/s | native, tokens/s | native / package |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        p, n = r["package_tokens_per_s"], r["native_tokens_per_s"]
        table.append(f"| {r['threads']} | {r['tokens']} | {p:,.0f} | {n:,.0f} | {n / p:.2f} |")
    md = (f"# Tokenizer rate\n\n- hardware: {hardware}{doc['cpu_flags']}\n"
          f"- commit: {doc['commit']}\n- date: {doc['date']}\n- model: {doc['model']}\n\n"
          f"{doc['what']}, {args.rounds} interleaved rounds.\n\n" + "\n".join(table) + "\n")  # fmt: skip
    path.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
