"""Where the host's time goes on the GPU machine, part by part, in one script run:

1. one small `Engine.step()` (a short query, its graph captured) split into its host calls;
2. a bulk `Embedder.encode` of 1,000 passages split into tokenization, id lists, packing and the
   engine;
3. with `--qwen3`: one long text of a real length (4,095 tokens) against a bucket-exact one
   (4,096), whose graph is then one dense sequence: the attention backend each one got.

Each part is the median of repeated loops timed with `time.perf_counter` (the device synchronized
where a part queues device work). Run the same script on an older tree (PYTHONPATH) for an A/B.

    PYTHONPATH=src python3 benchmarks/studies/host_path.py --model MINILM [--qwen3 DIR] --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.timing import median


def per_call_us(fn: Callable[[], object], n: int = 200, rounds: int = 7) -> float:
    """Median over rounds of the mean µs per call in a loop of n calls (then a device sync)."""
    import torch

    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return round(median(out), 2)


def step_parts(model: str) -> dict[str, float]:
    import torch

    from embedserve.embedder import Embedder
    from embedserve.engine.batch import PackedBatch
    from embedserve.engine.lazy import LazyTensor

    embedder = Embedder(model, device="cuda")
    engine = embedder.engine
    runner = engine.runner
    assert runner is not None
    (ids,) = embedder.tokenize(["how do i embed a short search query fast"])
    batch = PackedBatch.from_token_lists([ids])
    for _ in range(3):
        engine.step(batch).wait()  # eager, capture, replay
    plan = runner._plan(batch)
    assert plan is not None
    bucket = runner._buckets[plan.key]
    assert bucket.graph is not None and bucket.output is not None
    out = bucket.output[:1]
    done = torch.cuda.Event()
    done.record()
    raw = np.asarray(ids, dtype="<i4").tobytes()
    from embedserve.core.inputs import check_head
    from embedserve.server.service import build_response

    head = check_head(engine.hidden_size, "generic", None, True, "float32")
    pooled = np.random.default_rng(0).random((1, engine.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        return {
            "step + wait (whole)": per_call_us(lambda: engine.step(batch).wait()),
            "step (launch only)": per_call_us(lambda: engine.step(batch)),
            "PackedBatch.from_packed (server side)": per_call_us(
                lambda: PackedBatch.from_packed(np.frombuffer(raw, "<i4"), np.array([len(ids)]))
            ),
            "engine.check": per_call_us(lambda: engine.check(batch)),
            "runner._plan": per_call_us(lambda: runner._plan(batch)),
            "runner._stage (stage + H2D copy + event)": per_call_us(
                lambda: runner._stage(batch, plan, bucket.static)
            ),
            "graph.replay": per_call_us(bucket.graph.replay),
            "LazyTensor.from_device (pinned alloc + D2H + event)": per_call_us(
                lambda: LazyTensor.from_device(out)
            ),
            "torch.empty pinned [1, H]": per_call_us(
                lambda: torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            ),
            "torch.cuda.current_stream()": per_call_us(torch.cuda.current_stream),
            "Event().record()": per_call_us(lambda: torch.cuda.Event().record()),
            "event.synchronize (done)": per_call_us(done.synchronize),
            "torch.inference_mode() enter/exit": per_call_us(_enter_inference_mode),
            "server build_response (normalize + protobuf)": per_call_us(
                lambda: build_response(pooled, head)
            ),
        }


def _enter_inference_mode() -> None:
    import torch

    with torch.inference_mode():
        pass


def encode_parts(model: str, count: int) -> dict[str, Any]:
    from embedserve.embedder import Embedder
    from embedserve.engine.batch import PackedBatch

    embedder = Embedder(model, device="cuda")
    texts = corpus.passages(count)
    tok = embedder.inputs.tokenizer._keep_start  # the tokenizer `truncate="end"` uses
    for _ in range(2):
        embedder.encode(texts, truncate="end")  # eager, then capture
    encodings = tok.encode_batch_fast(texts)
    lists = [e.ids for e in encodings]
    budget = embedder.engine.batch_tokens
    num_tokens = sum(map(len, lists))

    def ms(fn: Callable[[], object], reps: int = 5) -> float:
        return round(per_call_us(fn, n=1, rounds=reps) / 1e3, 2)

    return {
        "passages": count,
        "tokens": num_tokens,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
        "RAYON_NUM_THREADS": os.environ.get("RAYON_NUM_THREADS"),
        "encode (whole) ms": ms(lambda: embedder.encode(texts, truncate="end")),
        "tokenizer.encode_batch_fast ms": ms(lambda: tok.encode_batch_fast(texts)),
        "Encoding.ids to lists ms": ms(lambda: [e.ids for e in encodings]),
        "inputs.tokenize (core, truncate=end) ms": ms(
            lambda: embedder.tokenize(texts, truncate="end")
        ),
        "PackedBatch.from_token_lists, all ms": ms(lambda: PackedBatch.from_token_lists(lists)),
        "embed_ids (engine, ids in) ms": ms(lambda: embedder.embed_ids(lists, batch_tokens=budget)),
    }


def long_text(qwen3: str, tokenizer_json: str | None) -> dict[str, Any]:
    """One text of 4,095 tokens against 4,096 (real text ids, Qwen3-0.6B shape)."""
    import torch

    from embedserve.engine.batch import PackedBatch
    from embedserve.engine.engine import Engine

    engine = Engine.from_folder(qwen3, device="cuda")
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for n in (4095, 4096, 4000):
        batch = PackedBatch.from_token_lists([rng.integers(0, 150000, n).tolist()])
        for _ in range(3):
            engine.step(batch).wait()
        times = []
        for _ in range(10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            engine.step(batch).wait()
            times.append((time.perf_counter() - t0) * 1e3)
        out[f"1 x {n} ms"] = round(median(times), 2)
    out["attention"] = dict(engine.choices.attention)
    out["attention_timings_ms"] = dict(engine.stats.attention_timings)
    out["attention_errors"] = dict(engine.stats.attention_errors)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="all-MiniLM-L6-v2 folder (fp16 copy)")
    parser.add_argument("--qwen3", help="a Qwen3-0.6B-shaped folder (make-checkpoint)")
    parser.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--tag", default="", help="suffix of the result file name")
    args = parser.parse_args()

    import torch

    result: dict[str, Any] = {
        "hardware": torch.cuda.get_device_name(),
        "commit": report.commit(),
        "date": time.strftime("%Y-%m-%d"),
        "software": report.versions("torch", "tokenizers", "numpy"),
        "step_parts_us": step_parts(args.model),
        "encode_parts": encode_parts(args.model, args.count),
    }
    if args.qwen3:
        result["long_text"] = long_text(args.qwen3, None)
    out = args.out or report.folder("studies")
    out.mkdir(parents=True, exist_ok=True)
    card = torch.cuda.get_device_name().split()[1].lower()  # "NVIDIA H100 80GB HBM3": h100
    path = out / f"host-path-{card}-{result['date'].replace('-', '')}{args.tag}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Host path parts, {result['hardware']}, commit {result['commit']}", ""]
    lines += ["| part | value |", "|---|---|"]
    for section in ("step_parts_us", "encode_parts"):
        lines += [f"| {k} ({section}) | {v} |" for k, v in result[section].items()]
    for k, v in result.get("long_text", {}).items():
        if k.endswith(" ms"):
            lines.append(f"| Qwen3-0.6B shape {k} | {v} |")
    table = "\n".join(lines) + "\n"
    path.with_suffix(".md").write_text(table)
    print(json.dumps(result.get("long_text", {}), indent=1))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
