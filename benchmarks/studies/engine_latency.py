"""Engine latency and throughput on one GPU: embedserve against Hugging Face `transformers` eager,
same weights, same inputs, one script run. Writes latency-<gpu>-<date>.json and .md.

    PYTHONPATH=src python3 benchmarks/studies/engine_latency.py --out DIR --commit abc1234 \
        --minilm .carry/minilm-fp16 --qwen3-tokenizer .carry/qwen3-tokenizer/tokenizer.json

Workloads: batch 1 at bucket-exact lengths (128, 512, 4096) and at real lengths beside them
(100, 500, 4095: a bucket with padding, what a user's text gets), and 100 passages.

Models: Qwen3-0.6B shape (random weights, bidirectional + mean) built with transformers' Qwen3
config and saved as a checkpoint folder, loaded through our loader; all-MiniLM-L6-v2 (real
weights, float16 copy, run in bf16 by both). Inputs are real English text (Python standard
library docstrings and the project's test passages) tokenized by each model's tokenizer.
Engine time is CUDA-event time from before `step()` to after its device-to-host copy.

Beside embedserve as built, a second engine as the baseline column (`--baseline`): graph-only
(graphs, no fusion) or no-epilogues (everything but the products fused with the chains after
them, `ops.CHAINS`: the A/B of that step, with each one's kernel profile).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness.engine_bench import (
    GRAPHS,
    HF,
    QWEN3_06B,
    bench_model,
    cut,
    floor_ms,
    guarded,
    measure_ceilings,
    real_text,
    token_stream,
)  # fmt: skip

from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine


def graph_us() -> Callable[..., float]:
    """The engine's own graph-replay timer (private: this study measures the engine's kernels
    the way its autotuner does)."""
    from embedserve.engine.kernels.tuning import _graph_us

    return _graph_us


def overlap(engine: Engine, batch: PackedBatch, n: int = 50) -> dict[str, float]:
    """Sequential (step, wait) against pipelined (step N+1, then wait N): wall ms per step."""
    for _ in range(3):
        engine.step(batch).wait()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        engine.step(batch).wait()
    seq = (time.perf_counter() - t0) * 1e3 / n
    returns, not_ready = [], 0
    t0 = time.perf_counter()
    prev = None
    for _ in range(n):
        t1 = time.perf_counter()
        h = engine.step(batch)
        returns.append(time.perf_counter() - t1)
        not_ready += not h.ready()
        if prev is not None:
            prev.wait()
        prev = h
    assert prev is not None
    prev.wait()
    pipe = (time.perf_counter() - t0) * 1e3 / n
    return {"sequential_ms_per_step": round(seq, 4), "pipelined_ms_per_step": round(pipe, 4),
            "step_return_us_median": round(statistics.median(returns) * 1e6, 1),
            "handles_not_ready_at_return": not_ready, "steps": n}  # fmt: skip


BASELINES = {"graph-only": {"fuse": False}, "no-epilogues": {"epilogues": False}}


def baseline_engine(folder: Path, baseline: str, **kw: Any) -> Engine:
    """The baseline column's engine: `BASELINES[baseline]`, graphs on, no fidelity guard."""
    return Engine.from_folder(
        folder, device="cuda", graphs=GRAPHS, fidelity=False, **BASELINES[baseline], **kw
    )


def profile_replay(engine: Engine, batch: PackedBatch, out: Path, name: str) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        engine.step(batch).wait()
    reps = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            engine.step(batch).wait()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    kernels = [e for e in events if "memcpy" not in e.name.lower()]

    def kind(name: str) -> str:
        name = name.lower()
        if any(k in name for k in ("flash", "fmha", "attention")):
            return "attention"
        if any(k in name for k in ("gemm", "cutlass", "xmma", "nvjet", "splitkreduce")):
            return "gemm"
        return "other"

    total_us = sum(e.device_time for e in kernels) / reps
    gemm_us = sum(e.device_time for e in kernels if kind(e.name) == "gemm") / reps
    attn_us = sum(e.device_time for e in kernels if kind(e.name) == "attention") / reps
    (out / f"profile-{name}.txt").write_text(
        prof.key_averages().table(sort_by="device_time_total", row_limit=40)
    )
    return {"kernels_per_forward": round(len(kernels) / reps, 1), "kernel_us_per_forward": round(total_us, 1),
            "gemm_us": round(gemm_us, 1), "attention_us": round(attn_us, 1),
            "other_us": round(total_us - gemm_us - attn_us, 1)}  # fmt: skip


def attention_levers() -> dict[str, Any]:
    """One attention call ([T, 16, 128] queries, 8 K/V heads, bidirectional) per backend, device
    µs per call from graph replays: FlashAttention-2 varlen, cuDNN without a mask (one dense
    sequence), cuDNN with the block-diagonal bias, and SDPA's flash / efficient kernels dense."""
    out: dict[str, Any] = {}
    for t in (128, 512, 4096):
        out.update(_attention_at(t))
    return out


def _attention_at(t: int) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from embedserve.engine.attention import RaggedLayout, attention_backends
    from embedserve.engine.choices import KernelChoices

    _graph_us = graph_us()

    out: dict[str, Any] = {}
    q = torch.randn(t, 16, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(t, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0, t], dtype=torch.int32, device="cuda")
    sid = torch.zeros(t, dtype=torch.int64, device="cuda")
    dense = RaggedLayout(cu, t, (), sid, dense=True)
    masked = RaggedLayout(cu, t, (), sid, mask=sid[:, None] == sid[None, :])
    k16, v16 = (x.repeat_interleave(2, dim=1) for x in (k, v))
    backends = attention_backends(KernelChoices())

    def sdpa(backend: Any) -> torch.Tensor:
        with sdpa_kernel([backend]):
            q4, k4, v4 = (x[None].transpose(1, 2) for x in (q, k16, v16))
            return F.scaled_dot_product_attention(q4, k4, v4)

    fns: dict[str, Callable[[], Any]] = {
        "varlen": lambda: backends["varlen"](q, k, v, dense, False),
        "cudnn_dense": lambda: backends["cudnn"](q, k, v, dense, False),
        "sdpa_flash_dense": lambda: sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa_efficient_dense": lambda: sdpa(SDPBackend.EFFICIENT_ATTENTION),
    }
    if t <= 2048:
        fns["cudnn_bias"] = lambda: backends["cudnn"](q, k, v, masked, False)
    flop = 4 * t * t * 16 * 128
    for name, fn in fns.items():
        r = guarded(functools.partial(_graph_us, _ignore_index(fn), 10))
        out[f"{name}@{t}"] = (
            {"us": round(r, 2), "tflop_s": round(flop / r / 1e6, 1)} if isinstance(r, float) else r
        )
    return out


def _ignore_index(fn: Callable[[], Any]) -> Callable[[int], Any]:
    return lambda i: fn()


def _linear_i(x: torch.Tensor, ws: list[torch.Tensor], i: int) -> torch.Tensor:
    return F.linear(x, ws[i % len(ws)])


def gemm_levers(deadline: float) -> dict[str, Any]:
    """Qwen3-0.6B's four GEMMs at M = 128: cuBLAS bf16 against cuBLAS fp16, and (time allowing)
    torch.compile max-autotune-no-cudagraphs (Triton templates), device µs per call."""
    _graph_us = graph_us()

    shapes = {
        "qkv": (4096, 1024),
        "out": (1024, 2048),
        "gate_up": (6144, 1024),
        "down": (1024, 3072),
    }
    out: dict[str, Any] = {}
    m = 128
    for name, (n, k) in shapes.items():
        row: dict[str, Any] = {}
        for dt in (torch.bfloat16, torch.float16):
            x = torch.randn(m, k, device="cuda", dtype=dt)
            ws = [torch.randn(n, k, device="cuda", dtype=dt) * k**-0.5 for _ in range(16)]
            call = functools.partial(_linear_i, x, ws)
            row[f"cublas_{str(dt)[6:]}"] = guarded(functools.partial(_graph_us, call, 16))
            if dt is torch.bfloat16 and name in ("qkv", "down") and time.time() < deadline:

                def autotuned(x: torch.Tensor = x, ws: list[torch.Tensor] = ws) -> dict[str, float]:
                    f = torch.compile(
                        lambda a, b: F.linear(a, b),
                        mode="max-autotune-no-cudagraphs",
                        dynamic=False,
                    )
                    t0 = time.perf_counter()
                    f(x, ws[0])
                    compile_s = time.perf_counter() - t0
                    us = _graph_us(lambda i: f(x, ws[i % 16]), 16)
                    return {"us": round(us, 2), "compile_s": round(compile_s, 1)}

                row["max_autotune_bf16"] = guarded(autotuned)
        out[f"{name} {m}x{n}x{k}"] = row
    return out


def host_profile(engine: Engine, batch: PackedBatch, path: Path, n: int = 300) -> dict[str, Any]:
    """cProfile of `n` steps (step + wait): where the host time of a step goes."""
    import cProfile
    import io
    import pstats

    for _ in range(5):
        engine.step(batch).wait()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(n):
        engine.step(batch).wait()
    prof.disable()
    wall = (time.perf_counter() - t0) / n
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    path.write_text(buf.getvalue())
    returns = []
    for _ in range(n):
        t1 = time.perf_counter()
        h = engine.step(batch)
        returns.append(time.perf_counter() - t1)
        h.wait()
    return {"us_per_step_profiled": round(wall * 1e6, 1),
            "step_return_us_median": round(statistics.median(returns) * 1e6, 1)}  # fmt: skip


def before_table(path: Path | None) -> list[str]:
    """The previous results file's p50s (engine time), for a before/after note."""
    if path is None or not path.exists():
        return []
    old = json.loads(path.read_text())
    rows = [f"Before (commit {old.get('commit')}, same script): embedserve p50 ms [replay ms]", "",
            "| model | workload | p50 ms | replay ms | tok/s |", "|---|---|---|---|---|"]  # fmt: skip
    recs = [r for r in old["records"] if r["system"] == "embedserve"]
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in recs:
        wl = f"{r['batch']} x {r['tokens']}"
        seen.setdefault((r["model"], wl), {})[r["metric"]] = r["value"]
    for (model, wl), v in seen.items():
        rows.append(
            f"| {model} | {wl} | {v.get('p50_ms')} | {v.get('mean_ms')} | {v.get('tokens_per_s', '')} |"
        )
    return [*rows, ""]


def save(args: argparse.Namespace, records: list[dict[str, Any]], extra: dict[str, Any], table: list[str]) -> None:  # fmt: skip
    import transformers

    today = datetime.date.today()
    result = {
        "suite": "latency", "hardware": torch.cuda.get_device_name(), "commit": args.commit,
        "date": today.isoformat(),
        "software": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "triton": importlib.import_module("triton").__version__,
                     "python": platform.python_version()},
        "graphs": {"max_tokens": GRAPHS.max_tokens, "max_seqs": GRAPHS.max_seqs,
                   "attention_candidates": list(GRAPHS.attention)},
        "records": records, **extra,
    }  # fmt: skip
    stem = f"latency-{'h200' if 'H200' in result['hardware'] else 'gpu'}-{today:%Y%m%d}"
    if args.baseline != "graph-only":  # an A/B of one step
        stem += f"-ab-{args.baseline}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    md = [f"# latency on {result['hardware']} — commit {args.commit}, {today}", "",
          f"software: {result['software']}", "",
          "Engine time per forward (CUDA events, step() to host copy done). Inputs: real English "
          "text (Python stdlib docstrings + tests/data/texts.py). Qwen3-0.6B shape with random "
          "weights (bidirectional, mean); all-MiniLM-L6-v2 real weights (fp16 copy, run in bf16). "
          "embedserve = graphs + torch.compile fusion + fused epilogues; graph-only = graphs, "
          "no fusion; no-epilogues = embedserve with each product and the chain after it as two "
          "kernels. "
          "cos = min cosine vs HF at warm-up.", "", *table, "", *before_table(args.before),
          "```json", json.dumps({k: v for k, v in extra.items() if k != "ceilings"}, indent=1), "```"]  # fmt: skip
    (args.out / f"{stem}.md").write_text("\n".join(md) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--minilm", type=Path, required=True)
    ap.add_argument("--qwen3-tokenizer", type=Path, required=True)
    ap.add_argument("--skip-qwen3", action="store_true")
    ap.add_argument("--before", type=Path, help="an earlier results JSON, for a before table")
    ap.add_argument("--budget-s", type=float, default=400, help="skip optional extras past this")
    ap.add_argument("--baseline", choices=sorted(BASELINES), default="graph-only",
                    help="the second engine's column")  # fmt: skip
    args = ap.parse_args()
    deadline = time.time() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    ceil = measure_ceilings()
    print("ceilings", ceil, flush=True)
    text = real_text()
    records: list[dict[str, Any]] = []
    header = f"| model | workload | HF eager p50 ms | embedserve p50 / p99 [replay] ms | cos | {args.baseline} p50 / p99 [replay] ms | cos | floor ms |"
    table = [header, "|" + "---|" * 8]
    extra: dict[str, Any] = {"ceilings": ceil}
    extra["levers_attention"] = guarded(attention_levers)
    print("attention levers", json.dumps(extra["levers_attention"]), flush=True)
    if not args.skip_qwen3:
        qwen3(args, text, ceil, deadline, records, table, extra)
        torch.cuda.empty_cache()  # its engines and model went with the call's frame
    minilm(args, text, ceil, records, table, extra)
    save(args, records, extra, table)
    print("\n".join(table))


def qwen3(args: argparse.Namespace, text: str, ceil: dict[str, float], deadline: float,
          records: list[dict[str, Any]], table: list[str], extra: dict[str, Any]) -> None:  # fmt: skip
    """The Qwen3-0.6B shape (random weights) against transformers' Qwen3Model, with overlap,
    kernel profiles and, time permitting, the GEMM levers."""
    from transformers import Qwen3Config, Qwen3Model

    cfg = Qwen3Config(**QWEN3_06B)
    cfg.is_causal = False  # our loader reads this as bidirectional
    torch.manual_seed(0)
    with torch.device("cuda"):
        hf_model = Qwen3Model(cfg).to(torch.bfloat16).eval()
    folder = Path("/tmp/qwen3-0.6b-random")
    hf_model.save_pretrained(folder)
    kw: dict[str, Any] = {"pooling": "mean", "attention": "bidirectional"}
    t0 = time.perf_counter()
    ours = Engine.from_folder(folder, device="cuda", graphs=GRAPHS, **kw)
    startup = time.perf_counter() - t0
    plain = baseline_engine(folder, args.baseline, **kw)
    extra["qwen3_startup"] = {
        "seconds": round(startup, 2),
        "fidelity_cosine": ours.fidelity_cosine,
    }
    print("qwen3 start-up", extra["qwen3_startup"], ours.stats.as_dict(), flush=True)
    stream = token_stream(args.qwen3_tokenizer, text)
    params = sum(t.numel() for n, t in hf_model.named_parameters() if "embed" not in n)
    rng = np.random.default_rng(1)
    hundred = [int(n) for n in rng.integers(64, 513, 100)]
    bench_model(
        "qwen3-0.6b", "random", {"embedserve": ours, f"embedserve-{args.baseline}": plain},
        HF(hf_model, bidirectional_4d=True), stream,
        [("1 x 16", [16], 200), ("1 x 100", [100], 200), ("1 x 128", [128], 200),
         ("1 x 500", [500], 200), ("1 x 512", [512], 200), ("1 x 4095", [4095], 50),
         ("1 x 4096", [4096], 50), ("100 x 64-512", hundred, 20)],
        lambda s: floor_ms(params, 1024, 28, 16 * 128, s, ceil), records, table,
    )  # fmt: skip
    b128 = cut(stream, [128], np.random.default_rng(2))
    extra["overlap_qwen3_1x128"] = guarded(lambda: overlap(ours, b128))
    for label, lens in (("1x128", [128]), ("1x4096", [4096]), ("100x64-512", hundred)):
        b = cut(stream, lens, np.random.default_rng(4))
        extra[f"profile_qwen3_{label}"] = {
            "embedserve": guarded(lambda b=b, label=label: profile_replay(ours, b, args.out, f"qwen3-{label}")),
            args.baseline: guarded(lambda b=b, label=label: profile_replay(plain, b, args.out, f"{args.baseline}-qwen3-{label}")),
        }  # fmt: skip
    extra["qwen3_stats"] = ours.stats.as_dict()
    extra[f"qwen3_stats_{args.baseline}"] = plain.stats.as_dict()
    extra["qwen3_attention_choice"] = ours.runner.attention_choice() if ours.runner else {}
    print(
        json.dumps({k: extra[k] for k in ("overlap_qwen3_1x128", "profile_qwen3_1x128")}),
        flush=True,
    )
    save(args, records, extra, table)
    if time.time() < deadline - 120:
        extra["levers_gemm"] = guarded(lambda: gemm_levers(deadline - 120))
        print("gemm levers", json.dumps(extra["levers_gemm"]), flush=True)


def minilm(args: argparse.Namespace, text: str, ceil: dict[str, float],
           records: list[dict[str, Any]], table: list[str], extra: dict[str, Any]) -> None:  # fmt: skip
    """all-MiniLM-L6-v2 (real weights) against transformers' AutoModel, with overlap and the
    host profile."""
    from transformers import AutoModel

    hf_bert = AutoModel.from_pretrained(args.minilm, dtype=torch.bfloat16).cuda().eval()
    mini = Engine.from_folder(args.minilm, device="cuda", graphs=GRAPHS)
    mini_plain = baseline_engine(args.minilm, args.baseline)
    extra["minilm_fidelity_cosine"] = mini.fidelity_cosine
    stream = token_stream(args.minilm / "tokenizer.json", text)
    rng = np.random.default_rng(3)
    passages = [int(n) for n in rng.integers(32, 257, 100)]
    mparams = sum(t.numel() for n, t in hf_bert.named_parameters() if "embeddings" not in n)
    bench_model(
        "all-MiniLM-L6-v2", "real", {"embedserve": mini, f"embedserve-{args.baseline}": mini_plain},
        HF(hf_bert, bidirectional_4d=False), stream,
        [("1 x 100", [100], 300), ("1 x 128", [128], 300), ("1 x 250", [250], 300),
         ("100 x 32-256", passages, 50)],
        lambda s: floor_ms(mparams, 384, 6, 384, s, ceil), records, table,
    )  # fmt: skip
    extra["minilm_stats"] = mini.stats.as_dict()
    extra[f"minilm_stats_{args.baseline}"] = mini_plain.stats.as_dict()
    extra["minilm_attention_choice"] = mini.runner.attention_choice() if mini.runner else {}
    m128 = cut(stream, [128], np.random.default_rng(2))
    extra["overlap_minilm_1x128"] = guarded(lambda: overlap(mini, m128))
    extra["profile_minilm_1x128"] = {
        "embedserve": guarded(lambda: profile_replay(mini, m128, args.out, "minilm-1x128")),
        args.baseline: guarded(lambda: profile_replay(mini_plain, m128, args.out, f"{args.baseline}-minilm-1x128")),
    }  # fmt: skip
    extra["host_minilm_1x128"] = guarded(
        lambda: host_profile(mini, m128, args.out / "host-profile-minilm-1x128.txt")
    )


if __name__ == "__main__":
    main()
