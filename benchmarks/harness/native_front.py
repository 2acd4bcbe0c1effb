"""The native request path's prototype (issue 55, "measure first"): `embedserve._native.Gateway`
(Rust: HTTP, JSON, tokenization, the FCFS token-budget queue) in front of an engine's `step()`
called through pyo3, in one process.

`serve_native(model, port, engine, threads)`: `engine` "null" answers every sequence at once with
a fixed vector (`null_engine.NullEngine`: the request path alone); a device ("cpu", "cuda") runs
the real engine there. Prints `native: ready on 127.0.0.1:PORT` once it takes requests. Started by a benchmark
as `harness_call("native_front:serve_native", MODEL, PORT, ENGINE, THREADS)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def packed_step(engine: Any) -> Any:
    """`step(ids, cu_seqlens)` over int32 bytes, as Tulip calls it: the engine's packed batch
    built from them, its handle returned without waiting."""
    from embedserve.engine.batch import PackedBatch

    def step(ids: bytes, cu_seqlens: bytes) -> Any:
        cu = np.frombuffer(cu_seqlens, "<i4")
        batch = PackedBatch.from_packed(
            np.frombuffer(ids, "<i4").astype(np.int64), np.diff(cu).astype(np.int32)
        )
        return engine.step(batch)

    return step


def gateway_for(engine: Any, folder: Path, served: Any = None, **settings: Any) -> Any:
    """The native gateway of `engine`'s model (its tokenizer, limits and Normalize) in front of
    `served`'s step (default: the engine's own); `settings`: the Gateway's other keywords."""
    from embedserve._native import Gateway
    from embedserve.gateway.main import GatewayConfig

    # the bounds the Python gateway declares, unless the caller sets its own
    settings.setdefault("max_body_bytes", GatewayConfig.max_body_bytes)
    settings.setdefault("max_inputs", GatewayConfig.max_inputs)
    return Gateway(
        str(folder / "tokenizer.json"),
        packed_step(engine if served is None else served),
        model="minilm",
        max_length=engine.spec.max_seq_length,
        batch_tokens=settings.pop("batch_tokens", engine.batch_tokens),
        normalize=engine.spec.normalize,
        **settings,
    )


def serve_native(
    model: str = "minilm", port: str = "0", engine: str = "null", threads: str = "1"
) -> None:
    from embedserve.engine.engine import Engine
    from embedserve.loading.bundled import resolve_model

    folder = resolve_model(model)
    real = Engine.from_folder(folder, device="cpu" if engine == "null" else engine)
    from embedserve.server.warmup import WARMUP_QUERIES, warm_up_graphs

    warm_up_graphs(real, WARMUP_QUERIES)  # on a GPU, as the Python server does at start-up
    if engine == "null":
        from harness.null_engine import NullEngine

        served: Any = NullEngine(real)
    else:
        served = real
    gateway = gateway_for(real, folder, served, port=int(port), threads=int(threads))
    print(f"native: ready on 127.0.0.1:{gateway.port}", flush=True)
    gateway.serve()
