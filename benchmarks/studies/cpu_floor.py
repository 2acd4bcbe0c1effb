"""What bounds one short query's forward on the CPU, and what the other ways to run it measure.

all-MiniLM-L6-v2 (the bundled real weights), one 12-token sequence, the engine's forward
(`Engine._forward`: embeddings, six layers, mean pooling) p50 of `--calls`, in this process:

- **eager**: the engine at the CPU default (bf16 with the weights packed once for oneDNN), and
  fp32;
- **compiled**: the same forward through `torch.compile` (Inductor's C++ backend, weights frozen
  and packed by Inductor, the C++ wrapper), one static shape, fullgraph: what a CPU "graph"
  would give; its compile seconds beside it; and with max-autotune, where Inductor's own C++
  GEMM template competes with oneDNN's product for each shape;
- **int8**: every linear as a dynamically quantized int8 product (fbgemm, per-channel weights,
  per-tensor activations), the rest fp32; its least cosine to fp32 over `--texts` queries and
  passages (the fidelity guard asks 0.999);
- **caches**: `Embedder.encode([query])` back to back (as the in-process suites time it), and
  with 2 ms of other work over 8 MB between calls (as a server's request path has);
- **by operator**: where `Embedder.encode([query])` of the suites' short queries goes, each kind
  of operator timed around its calls inside the forward (a timer costs ~0.2 us), ms per encode;
- **rows**: one packed bf16 product per layer shape at 1 to 32 rows, its weight hot (the same
  call repeated): how its cost grows with the rows.

The floors: the layers' bf16 weight bytes over the measured read bandwidth (a sum over an array
of that size, both cores), and the forward's FLOPs over the measured bf16 matrix rate (the packed
product at 2,048 rows); beside them the 24 linears alone at 12 rows, each weight read cold
(the 24 cycled, as in a forward).

    .venv/bin/python benchmarks/studies/cpu_floor.py [--calls 400]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report

TOKENS = 12


def p50_ms(fn: Callable[[], Any], calls: int) -> float:
    for _ in range(min(50, calls)):
        fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def engine(dtype: str, pack: bool = True) -> Any:
    """An Embedder at `dtype`; `pack=False` leaves the linears' weights unpacked (Inductor
    freezes and packs them itself, and cannot trace oneDNN's opaque packed tensor)."""
    import embedserve.engine.engine as engine_module
    from embedserve import Embedder

    if pack:
        return Embedder("minilm", dtype=dtype)
    keep = engine_module.can_pack
    engine_module.can_pack = lambda *a: False  # type: ignore[assignment]
    try:
        return Embedder("minilm", dtype=dtype)
    finally:
        engine_module.can_pack = keep  # type: ignore[assignment]


def forward_fn(embedder: Any) -> Callable[[], torch.Tensor]:
    """The engine's forward of one fixed 12-token sequence, as `step` runs it on the CPU."""
    from embedserve.engine.attention.layout import RaggedLayout

    eng = embedder.engine
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (TOKENS,), generator=gen)
    positions = torch.arange(TOKENS)
    zeros = torch.zeros(TOKENS, dtype=torch.long)
    layout = RaggedLayout(torch.tensor([0, TOKENS], dtype=torch.int32), TOKENS, (TOKENS,))

    def run() -> torch.Tensor:  # called under torch.inference_mode()
        return eng._forward(ids, positions, zeros, zeros, layout, eng.attend)

    return run


def compiled(calls: int, autotune: bool = False) -> tuple[float, float, float]:
    """The forward through Inductor: (p50 ms, compile s, cosine to the eager forward).
    `autotune`: max-autotune with Inductor's own C++ GEMM template beside oneDNN's product,
    each product's fastest kept."""
    import torch._inductor.config as inductor

    torch._dynamo.reset()
    inductor.freezing = True
    inductor.cpp_wrapper = True
    inductor.max_autotune = autotune
    inductor.max_autotune_gemm_backends = "CPP,ATEN" if autotune else "ATEN"
    run = forward_fn(engine("bfloat16", pack=False))
    with torch.inference_mode():
        fast = torch.compile(run, dynamic=False, fullgraph=True)
        t = time.perf_counter()
        out = fast()
        seconds = time.perf_counter() - t
        cos = float(torch.nn.functional.cosine_similarity(out.float(), run().float()).min())
        return p50_ms(fast, calls), seconds, cos


def int8(calls: int, texts: list[str]) -> tuple[float, float]:
    """The forward with int8 dynamic linears (`cpu_int8.dynamic_per_tensor`, every form is
    measured there): (p50 ms, least cosine to fp32 over `texts`)."""
    from studies.cpu_int8 import KINDS, dynamic_per_tensor

    quantized, reference = engine("float32"), engine("float32")
    dynamic_per_tensor(quantized, KINDS)
    a = quantized.encode(texts, truncate="end")
    b = reference.encode(texts, truncate="end")
    with torch.inference_mode():
        return p50_ms(forward_fn(quantized), calls), float((a * b).sum(1).min())


def linears_cold(calls: int) -> tuple[float, int, int]:
    """MiniLM's 24 layer products at 12 rows, packed bf16, each weight read after the other 23:
    (ms per forward's worth, weight bytes, FLOPs)."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(384, 1152), (384, 384), (384, 1536), (1536, 384)] * 6
    xs = {k: torch.randn(TOKENS, k, generator=gen).bfloat16() for k in (384, 1536)}
    packed = []
    for k, n in shapes:
        w = (torch.randn(n, k, generator=gen) / 20).bfloat16()
        packed.append(
            (k, torch.ops.mkldnn._reorder_linear_weight(w, 16), torch.zeros(n).bfloat16())
        )

    def run() -> None:
        for k, p, b in packed:
            torch.ops.mkldnn._linear_pointwise(xs[k], p, b, "none", [], "")

    nbytes = sum(2 * k * n for k, n in shapes)
    return p50_ms(run, calls), nbytes, sum(2 * TOKENS * k * n for k, n in shapes)


def encode_after_other_work(calls: int) -> tuple[float, float]:
    """`Embedder.encode([query])` p50 back to back, and after 2 ms of other work touching 8 MB
    between calls (what a server's request path, its gateway and its client do between two
    forwards): ms, ms."""
    embedder = engine("bfloat16")
    queries = corpus.queries(256)
    scrub = np.ones(8 * 2**20 // 8)

    def timed(gap: bool) -> float:
        times = []
        for i in range(calls + 50):
            if gap:
                until = time.perf_counter() + 0.002
                while time.perf_counter() < until:
                    scrub.sum()
            t = time.perf_counter()
            embedder.encode([queries[i % len(queries)]])
            times.append(time.perf_counter() - t)
        return float(np.median(times[50:]) * 1e3)

    return timed(False), timed(True)


def by_operator(calls: int) -> dict[str, float]:
    """ms per `encode([query])` of each kind of operator in the forward, of the step and the
    forward themselves, and of the whole call (the suites' short queries, back to back)."""
    import torch.nn.functional as F

    from embedserve.engine.layers.linear import Linear

    embedder = engine("bfloat16")
    spent: dict[str, float] = {}

    def timed(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[kind] = spent.get(kind, 0.0) + time.perf_counter() - t

        return run

    patched = {"layer_norm": "LayerNorm", "gelu": "GELU", "embedding": "embedding lookups",
               "scaled_dot_product_attention": "SDPA"}  # fmt: skip
    kept = {name: getattr(F, name) for name in patched}
    for name, kind in patched.items():
        setattr(F, name, timed(kind, kept[name]))
    for m in embedder.engine.model.modules():
        if isinstance(m, Linear):
            m.forward = timed("24 linears", m.forward)  # type: ignore[method-assign]
    eng = embedder.engine
    eng.ops = dataclasses.replace(eng.ops, pool=timed("pooling", eng.ops.pool))
    eng._forward = timed("forward", eng._forward)  # type: ignore[method-assign]
    eng.step = timed("step", eng.step)  # type: ignore[method-assign]
    queries = corpus.queries(256)
    try:
        for q in queries[:100]:
            embedder.encode([q])
        spent.clear()
        t = time.perf_counter()
        for i in range(calls):
            embedder.encode([queries[i % len(queries)]])
        spent["encode"] = time.perf_counter() - t
    finally:
        for name, fn in kept.items():
            setattr(F, name, fn)
    return {kind: seconds / calls * 1e3 for kind, seconds in spent.items()}


def rows_sweep(calls: int) -> dict[tuple[int, int, int], float]:
    """us of one packed bf16 product (k -> n) at m rows, its weight hot: {(k, n, m): us}."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for k, n in [(384, 1152), (384, 384), (384, 1536), (1536, 384)]:
        w = (torch.randn(n, k, generator=gen) / 20).bfloat16()
        packed, bias = torch.ops.mkldnn._reorder_linear_weight(w, 16), torch.zeros(n).bfloat16()
        for m in (1, 4, 12, 32):
            x = torch.randn(m, k, generator=gen).bfloat16()
            run = functools.partial(
                torch.ops.mkldnn._linear_pointwise, x, packed, bias, "none", [], ""
            )
            out[(k, n, m)] = p50_ms(run, calls * 4) * 1e3
    return out


def matrix_rate() -> float:
    """bf16 FLOP/s of the packed product at 2,048 rows (384 -> 1,536), both cores."""
    x = torch.randn(2048, 384).bfloat16()
    p = torch.ops.mkldnn._reorder_linear_weight(torch.randn(1536, 384).bfloat16(), 2048)
    ms = p50_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""), 100)
    return 2 * 2048 * 384 * 1536 / (ms / 1e3)


def read_bandwidth(nbytes: int) -> float:
    """Bytes/s of a sum over an fp32 array of `nbytes`, both cores."""
    a = torch.ones(nbytes // 4)
    ms = p50_ms(lambda: a.sum(), 50)
    return nbytes / (ms / 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--texts", type=int, default=200, help="queries + passages for int8's cosine")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    texts = corpus.queries(args.texts // 2) + corpus.passages(args.texts - args.texts // 2)
    rows: dict[str, float] = {}
    with torch.inference_mode():
        rows["eager bf16 (packed), ms"] = p50_ms(forward_fn(engine("bfloat16")), args.calls)
        rows["eager fp32, ms"] = p50_ms(forward_fn(engine("float32")), args.calls)
    c_ms, c_s, c_cos = compiled(args.calls)
    rows["compiled bf16 (Inductor C++, frozen), ms"] = c_ms
    rows["compiled: compile seconds"] = c_s
    rows["compiled: cosine to eager"] = c_cos
    c_ms, c_s, c_cos = compiled(args.calls, autotune=True)
    rows["compiled, max-autotune (C++ GEMM template allowed), ms"] = c_ms
    rows["compiled, max-autotune: compile seconds"] = c_s
    rows["compiled, max-autotune: cosine to eager"] = c_cos
    q_ms, q_cos = int8(args.calls, texts)
    rows["int8 dynamic linears, ms"] = q_ms
    rows["int8: least cosine to fp32"] = q_cos
    back_to_back, after_work = encode_after_other_work(args.calls)
    rows["encode([query]) back to back, ms"] = back_to_back
    rows["encode([query]) after 2 ms of other work over 8 MB, ms"] = after_work
    for kind, ms in by_operator(args.calls * 4).items():
        rows[f"encode([query]) by operator: {kind}, ms per encode"] = ms
    for (k, n, m), us in rows_sweep(args.calls).items():
        rows[f"packed product {k} -> {n} at {m} rows (hot), us"] = us
    lin_ms, weight_bytes, flops = linears_cold(args.calls)
    rows["24 linears alone (bf16 packed, cold), ms"] = lin_ms
    bandwidth = read_bandwidth(weight_bytes)
    rate = matrix_rate()
    rows["read bandwidth at the weights' size, GB/s"] = bandwidth / 1e9
    rows["bf16 matrix rate at 2,048 rows, TFLOP/s"] = rate / 1e12
    rows["floor: weight bytes / bandwidth, ms"] = weight_bytes / bandwidth * 1e3
    rows["floor: FLOPs / matrix rate, ms"] = flops / rate * 1e3
    rows["linears at 12 rows, TFLOP/s"] = flops / (lin_ms / 1e3) / 1e12
    records = [
        {"system": "embedserve engine forward", "model": "all-MiniLM-L6-v2", "weights": "real",
         "tokens": TOKENS, "batch": 1, "concurrency": 1, "metric": name, "value": value,
         "scope": "forward only"}
        for name, value in rows.items()
    ]  # fmt: skip
    notes = (
        f"One {TOKENS}-token sequence, p50 of {args.calls} calls per timed row, in one process "
        f"(torch threads: {torch.get_num_threads()}). Weights of the six layers: "
        f"{weight_bytes / 1e6:.1f} MB in bf16; the forward's layer FLOPs: {flops / 1e9:.3f} G. "
        "The floors assume the products stream their weights at the measured read bandwidth "
        "or run at the measured large-matrix rate; the measured linears show how far from both "
        "oneDNN's small-row products are."
    )
    _, table = report.write(
        "cpu-floor", report.cpu_hardware(), f"cpu{os.cpu_count()}", records,
        report.versions("torch"), notes, args.out,
    )  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
