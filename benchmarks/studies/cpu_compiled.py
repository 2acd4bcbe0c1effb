"""One dynamic-shape Inductor compile of the CPU forward for a lone sequence, against the eager
engine: how many graphs the lengths of short queries take, the compile time, and the gain.

all-MiniLM-L6-v2 (the bundled real weights), bf16. Compiled: `Engine._forward` of one sequence
through `torch.compile(dynamic=True)` (Inductor's C++ backend, weights frozen and packed by
Inductor, the C++ wrapper), its token count an input; the first call compiles. Eager: the engine
at the CPU default (weights packed for oneDNN, the products' post-ops). For each length, p50 of
`--calls` forwards of each, called in turn; the compiled forward's cosine to the eager one.
Dynamo's count of unique graphs says whether the lengths shared one compile.

    .venv/bin/python benchmarks/studies/cpu_compiled.py [--lengths 8,12,16,5,20,32] [--calls 600]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report
from studies.cpu_floor import engine


def main() -> None:
    import torch._dynamo
    import torch._inductor.config as inductor

    from embedserve.engine.attention.layout import RaggedLayout

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="8,12,16,5,20,32")
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    inductor.freezing = True
    inductor.cpp_wrapper = True
    compiled_engine = engine("bfloat16", pack=False).engine
    eager = engine("bfloat16").engine

    def lone(eng: Any, ids: torch.Tensor, cu: torch.Tensor, n: int) -> torch.Tensor:
        positions, zeros = torch.arange(n), torch.zeros(n, dtype=torch.long)
        layout = RaggedLayout(cu, n, (n,))
        return eng._forward(ids, positions, zeros, zeros, layout, eng.attend)

    compiled = torch.compile(lambda ids, cu, n: lone(compiled_engine, ids, cu, n), dynamic=True)
    records: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in map(int, args.lengths.split(",")):
            ids = torch.randint(1000, 20000, (n,), generator=gen)
            cu = torch.tensor([0, n], dtype=torch.int32)
            t = time.perf_counter()
            got = compiled(ids, cu, n)
            first = time.perf_counter() - t
            want = lone(eager, ids, cu, n)
            cos = float(torch.nn.functional.cosine_similarity(got.float(), want.float()).min())
            times: dict[str, list[float]] = {"compiled": [], "eager": []}
            runs = {"compiled": compiled, "eager": lambda i, c, k: lone(eager, i, c, k)}
            for _ in range(args.calls):
                for name, fn in runs.items():
                    t = time.perf_counter()
                    fn(ids, cu, n)
                    times[name].append(time.perf_counter() - t)
            p50 = {k: float(np.median(v) * 1e3) for k, v in times.items()}
            print(f"{n} tokens: first call {first:.1f} s, compiled {p50['compiled']:.3f} ms, "
                  f"eager {p50['eager']:.3f} ms, cosine {cos:.6f}", flush=True)  # fmt: skip
            base = {"model": "all-MiniLM-L6-v2", "weights": "real", "tokens": n, "batch": 1,
                    "concurrency": 1, "scope": "forward only"}  # fmt: skip
            records += [
                {**base, "system": "embedserve, Inductor dynamic", "metric": "forward p50 (ms)",
                 "value": round(p50["compiled"], 3), "cosine_min": round(cos, 6)},
                {**base, "system": "embedserve, Inductor dynamic",
                 "metric": "first call (s)", "value": round(first, 2)},
                {**base, "system": "embedserve, eager (CPU default)",
                 "metric": "forward p50 (ms)", "value": round(p50["eager"], 3)},
            ]  # fmt: skip
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    notes = (
        f"One process (torch threads: {torch.get_num_threads()}); per length {args.calls} "
        f"forwards of each engine, called in turn. Dynamo compiled {graphs} unique graph(s) for "
        f"the lengths {args.lengths}; a length's 'first call' is its compile, if any."
    )
    _, table = report.write(
        "cpu-compiled", report.cpu_hardware(), f"cpu{os.cpu_count()}", records,
        report.versions("torch"), notes, args.out,
    )  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
