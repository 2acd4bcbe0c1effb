"""Whether any int8 form of all-MiniLM-L6-v2's linears passes the fidelity guard on the CPU, and
what it would save: the one lever that measured faster than bf16 for a short query.

Every form quantizes the six layers' linears (query/key/value, attention output, FFN up, FFN
down; per output channel, symmetric int8 weights) of the fp32 model and embeds held-out queries
and passages (cut at the model's 256 tokens); each vector's cosine to fp32's is the guard's
measure (0.999 on every text). Forms:

- **dynamic, per tensor** (fbgemm's `quantized::linear_dynamic`, the real kernel): activations
  quantized per call to uint8 with one scale per tensor; all four kinds of linear, and each kind
  alone (which ones break the guard);
- **per token** (emulated in fp32: a scale per row, symmetric int8), alone and after
  SmoothQuant's per-input-channel scaling (alpha 0.5, activation maxima from other texts), with
  and without the FFN down product (whose input, GELU's output, has the largest outliers);
- **weight-only** (ATen's `_weight_int8pack_mm`, the real kernel: int8 weights, bf16
  activations).

Speed, where a real kernel exists: `Embedder.encode([query])` p50 of the suites' short queries,
the forms and the bf16 default called in turn, query by query.

    .venv/bin/python benchmarks/studies/cpu_int8.py [--texts 300] [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report

KINDS = ("qkv", "out", "up", "down")


def _linears(embedder: Any, kinds: tuple[str, ...]) -> list[Any]:
    return [getattr(layer, k) for layer in embedder.engine.model.layers for k in kinds]


def _int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 of `w` [out, in]: (int8 values, fp32 scales)."""
    scales = (w.abs().amax(1) / 127).clamp_min(1e-12)
    return (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8), scales


def dynamic_per_tensor(embedder: Any, kinds: tuple[str, ...]) -> None:
    for m in _linears(embedder, kinds):
        w = m.weight.detach().float()
        scales = (w.abs().amax(1) / 127).clamp_min(1e-12)
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated, still the way in
            warnings.simplefilter("ignore")
            qw = torch.quantize_per_channel(w, scales, zero, 0, torch.qint8)
        bias = None if m.bias is None else m.bias.detach().float()
        packed = torch.ops.quantized.linear_prepack(qw, bias)
        m.forward = lambda x, p=packed: torch.ops.quantized.linear_dynamic(x, p)


def per_token(embedder: Any, kinds: tuple[str, ...], smooth_on: list[str] | None) -> None:
    """Emulated: each row of a linear's input quantized to int8 with its own scale; with
    `smooth_on` (calibration texts), SmoothQuant's scaling (alpha 0.5) moved from the input to
    the weight first (exact in real arithmetic)."""
    mods = _linears(embedder, kinds)
    smooth = {id(m): torch.ones(m.in_features) for m in mods}
    if smooth_on is not None:
        amax = {id(m): torch.zeros(m.in_features) for m in mods}

        def record(mod: Any, args: tuple[torch.Tensor, ...]) -> None:
            amax[id(mod)] = torch.maximum(amax[id(mod)], args[0].abs().amax(0).float())

        hooks = [m.register_forward_pre_hook(record) for m in mods]
        embedder.encode(smooth_on, truncate="end")
        for h in hooks:
            h.remove()
        for m in mods:
            wmax = m.weight.detach().abs().amax(0).clamp_min(1e-5)
            smooth[id(m)] = amax[id(m)].clamp_min(1e-5).sqrt() / wmax.sqrt()

    def rows_int8(x: torch.Tensor) -> torch.Tensor:
        s = (x.abs().amax(1, keepdim=True) / 127).clamp_min(1e-12)
        return (x / s).round().clamp(-127, 127) * s

    for m in mods:
        s = smooth[id(m)]
        q, scales = _int8_rows(m.weight.detach() * s)
        wq = q.float() * scales[:, None]
        m.forward = lambda x, s=s, wq=wq, b=m.bias: F.linear(rows_int8(x / s), wq, b)


def weight_only(embedder: Any, reference: Any) -> None:
    """`embedder` (bf16, packed) computes each linear from int8 weights of `reference`'s fp32."""
    for m, mf in zip(_linears(embedder, KINDS), _linears(reference, KINDS), strict=True):
        q, scales = _int8_rows(mf.weight.detach().float())
        w8, s8, b = q.contiguous(), scales.bfloat16(), mf.bias.detach().bfloat16()
        m.forward = lambda x, w8=w8, s8=s8, b=b: torch._weight_int8pack_mm(x, w8, s8) + b


def cosines(vectors: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    c = np.sum(vectors * reference, axis=1)  # both normalized
    return float(c.min()), float(np.percentile(c, 1))


def in_turn(encoders: dict[str, Callable[[list[str]], Any]], calls: int) -> dict[str, float]:
    """p50 ms of one short query per call, the encoders called in turn, query by query."""
    queries = corpus.queries(256)
    times: dict[str, list[float]] = {name: [] for name in encoders}
    for i in range(calls + 50):
        for name, encode in encoders.items():
            t = time.perf_counter()
            encode([queries[i % len(queries)]])
            if i >= 50:
                times[name].append(time.perf_counter() - t)
    return {name: float(np.median(t) * 1e3) for name, t in times.items()}


def main() -> None:
    from embedserve import Embedder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=300, help="held-out queries + passages")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    half = args.texts // 2
    texts = corpus.queries(half) + corpus.passages(args.texts - half)
    calibration = corpus.queries(100, seed=7) + corpus.passages(100, seed=7)
    fp32 = Embedder("minilm", dtype="float32")
    reference = fp32.encode(texts, truncate="end")
    fidelity: dict[str, tuple[float, float]] = {}

    def form(name: str, build: Callable[[Any], None], dtype: str = "float32") -> Any:
        e = Embedder("minilm", dtype=dtype)
        build(e)
        fidelity[name] = cosines(e.encode(texts, truncate="end"), reference)
        print(f"{name}: least cosine {fidelity[name][0]:.6f}", flush=True)
        return e

    default = form("bf16 (the CPU default)", lambda e: None, dtype="bfloat16")
    dynamic = form("int8 dynamic per tensor, all linears", lambda e: dynamic_per_tensor(e, KINDS))
    for kind in KINDS:
        form(f"int8 dynamic per tensor, {kind} only", lambda e, k=kind: dynamic_per_tensor(e, (k,)))
    form("int8 per token (emulated), all linears", lambda e: per_token(e, KINDS, None))
    form(
        "int8 per token + SmoothQuant (emulated), all linears",
        lambda e: per_token(e, KINDS, calibration),
    )
    form(
        "int8 per token + SmoothQuant (emulated), all but FFN down",
        lambda e: per_token(e, KINDS[:3], calibration),
    )
    weights = form(
        "int8 weight-only, bf16 activations", lambda e: weight_only(e, fp32), dtype="bfloat16"
    )
    speed = in_turn(
        {
            "bf16 (the CPU default)": default.encode,
            "int8 dynamic per tensor, all linears": dynamic.encode,
            "int8 weight-only, bf16 activations": weights.encode,
        },
        args.calls,
    )
    records = []
    for name, (least, p1) in fidelity.items():
        base = {"system": f"embedserve, {name}", "model": "all-MiniLM-L6-v2", "weights": "real",
                "concurrency": 1, "scope": "in process, tokenize included"}  # fmt: skip
        records.append({**base, "metric": "least cosine to fp32", "value": round(least, 6)})
        records.append({**base, "metric": "1st percentile cosine", "value": round(p1, 6)})
        if name in speed:
            records.append({**base, "metric": "one short query p50, in turn (ms)",
                            "tokens": "3-12 words", "value": round(speed[name], 3)})  # fmt: skip
    notes = (
        f"{args.texts} held-out texts (half queries of 3-12 words, half passages cut at 256 "
        "tokens) against the fp32 model's vectors; the guard asks 0.999 on every text. "
        "'Emulated' forms quantize and dequantize in fp32 (their fidelity, no kernel); the "
        f"speed rows call the three real forms in turn, query by query, {args.calls} calls "
        f"each (torch threads: {torch.get_num_threads()})."
    )
    _, table = report.write(
        "cpu-int8", report.cpu_hardware(), f"cpu{os.cpu_count()}", records,
        report.versions("torch"), notes, args.out,
    )  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
