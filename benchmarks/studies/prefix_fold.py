"""Shared prefixes folded (issue 56, `engine/prefix_fold.py`): the same engine with the fold on
and off, in alternating rounds, on the workloads that repeat a prefix in every sequence:

- Qwen3-Reranker (the 0.6B shape, random weights, the real tokenizer): `Scorer.score` of one
  query against `--docs` documents cut to `--doc-tokens` tokens (the template repeats the
  system text, the instruction and the query before each);
- Qwen3-Embedding (the 0.6B shape): `Embedder.encode` of `--queries` short queries with the
  model's query prompt (`Instruct: ... Query:`).

Per workload and way: the median seconds, the tokens the engine computed (the folded packing's)
against the batch's, and the largest difference between the ways' answers (scores: absolute;
vectors: 1 - cosine).

    PYTHONPATH=src python3 benchmarks/studies/prefix_fold.py [--docs 5,25] [--doc-tokens 480]
        [--queries 64] [--rounds 3] [--score-rounds 1] [--score-batch-tokens N]
        [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.engine import prefix_fold


def timed(engine: Any, run: Callable[[], Any], rounds: int) -> dict[str, Any]:
    """Each way's median seconds over `rounds` alternating rounds after a warm-up, its last
    answer, and the tokens the engine computed in one folded round (the folded packings')
    against the batches' tokens."""
    seen = [0, 0]
    plan = prefix_fold.plan

    def counting(batch: Any) -> Any:
        fold = plan(batch)
        seen[0] += len(fold.input_ids) if fold is not None else batch.num_tokens
        seen[1] += batch.num_tokens
        return fold

    run()  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    answers: dict[bool, Any] = {}
    prefix_fold.plan = counting  # type: ignore[assignment]  # asked only while folding
    try:
        for _ in range(rounds):
            for fold in (True, False):
                engine.fold_prefixes = fold
                start = time.perf_counter()
                answers[fold] = np.asarray(run())
                times[fold].append(time.perf_counter() - start)
    finally:
        prefix_fold.plan = plan  # type: ignore[assignment]
        engine.fold_prefixes = True
    return {"times": times, "answers": answers, "tokens": (seen[0] // rounds, seen[1] // rounds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", default="5,25", help="documents per query, e.g. 5,25,50")
    ap.add_argument("--doc-tokens", type=int, default=480, help="about; the batches' are counted")
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="of the queries")
    ap.add_argument("--score-rounds", type=int, default=1, help="of each reranker shape")
    # a fold is within one batch: the CPU's budget (~1,024 tokens) holds one 512-token pair
    ap.add_argument(
        "--score-batch-tokens",
        type=int,
        default=None,
        help="the reranker's batch budget (default: the engine's)",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    args = ap.parse_args()
    from embedserve.embedder import Embedder
    from embedserve.scorer import Scorer

    root = Path(tempfile.mkdtemp(prefix="prefix-fold-"))
    reranker = make_checkpoint(root / "rr", arch="qwen3-reranker-0.6b", seed=7)
    embedder_folder = make_checkpoint(root / "emb", arch="qwen3-0.6b", seed=8)
    records: list[dict[str, Any]] = []
    notes: list[str] = []

    def add(name: str, model: str, engine: Any, run: Callable[[], Any], kind: str,
            batch: int, rounds: int) -> None:  # fmt: skip
        out = timed(engine, run, rounds)
        computed, total = out["tokens"]
        a, b = out["answers"][True], out["answers"][False]
        if kind == "scores":
            diff = float(np.abs(a - b).max())
        else:
            cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
            diff = float(1 - cos.min())
        ms = {fold: statistics.median(t) * 1e3 for fold, t in out["times"].items()}
        for fold, label in ((True, "folded"), (False, "unfolded")):
            tokens = computed if fold else total
            for metric, value in (("ms", ms[fold]), ("tokens_computed", tokens),
                                  ("speedup", ms[False] / ms[fold]), ("max_diff", diff)):  # fmt: skip
                records.append({
                    "system": f"embedserve {name}, {label}", "model": model,
                    "weights": "random", "dtype": str(engine.dtype).replace("torch.", ""),
                    "batch": batch, "tokens": f"{total} in the batches",
                    "concurrency": 1, "metric": metric, "value": round(value, 6),
                    "scope": "in_process",
                })  # fmt: skip
        notes.append(f"{name} x {batch}: {ms[False]:.1f} -> {ms[True]:.1f} ms "
                     f"({ms[False] / ms[True]:.2f}x), tokens {total} -> {computed}, "
                     f"largest difference {diff:.2e}")  # fmt: skip
        print(notes[-1], flush=True)

    scorer = Scorer(reranker, device=args.device)
    query = "which passages explain how shared prefixes are computed once in a batch?"
    for n in (int(d) for d in args.docs.split(",")):
        words = round(args.doc_tokens / 1.3)  # English prose: about 1.3 tokens a word
        docs = corpus.passages(n, min_words=words, max_words=words + 1, seed=n)
        add("Scorer.score (1 query)", "Qwen3-Reranker-0.6B shape", scorer.engine,
            lambda docs=docs: scorer.score(query, docs, batch_tokens=args.score_batch_tokens),
            "scores", n, args.score_rounds)  # fmt: skip
    embedder = Embedder(embedder_folder, device=args.device)
    texts = corpus.queries(args.queries)
    add("Embedder.encode (query prompt)", "Qwen3-Embedding-0.6B shape", embedder.engine,
        lambda: embedder.encode(texts, input_type="query"), "vectors", args.queries, args.rounds)  # fmt: skip
    text = (
        f"Median of {args.score_rounds} (reranker) and {args.rounds} (queries) alternating "
        f"rounds after a warm-up (reranker batch budget: "
        f"{args.score_batch_tokens or 'the engine default'}), the same engine with "
        f"`fold_prefixes` on and off. " + "; ".join(notes) + f". {os.cpu_count()} cores."
    )
    if args.device == "cpu":
        hardware, slug = report.cpu_hardware(), "cpu2" if os.cpu_count() == 2 else "cpu"
    else:
        import torch

        hardware, slug = torch.cuda.get_device_name(), report.card_slug()
    _, table = report.write("prefix-fold", hardware, slug, records, report.versions("torch"),
                            text, args.out)  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
