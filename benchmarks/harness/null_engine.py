"""A server whose engine answers every sequence at once with a fixed vector: the host path alone.

`serve_null(model, port)` runs the real server process (`embedserve.server.main`: its gRPC and
unix-socket ends, queue, scheduler, engine and results threads, response encoding) in front of
`NullEngine`, which keeps the real engine's spec and limits but whose `step` does no torch work.
What a benchmark measures through it is the ceiling of everything but the model: the gateway
(HTTP, JSON, tokenization, splitting), the hop, and the server's per-request Python.

Started by a benchmark as `harness_call("null_engine:serve_null", MODEL, PORT)`; it prints the
server's own ready line. `serve_native_null(model, port)` is `embedserve serve --native` (Ivy,
Tulip and the engine in one process) in front of the same `NullEngine`; it prints `serve`'s ready
line.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np


class NullEngine:
    """The real engine for everything the server reads (spec, width, budgets, checks); `step`
    answers at once: every sequence's row is one fixed unit vector (a read-only view, no copy)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        width = engine.output_width
        self._row = np.full((1, width), 1.0 / np.sqrt(width), dtype=np.float32)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def seam(self) -> Any:
        """The real engine's record with this `step` (the one the server runs)."""
        import dataclasses

        return dataclasses.replace(self._engine.seam(), step=self.step)

    def step(self, batch: Any) -> Any:
        from embedserve.server.handles import Ready

        return Ready(np.broadcast_to(self._row, (batch.num_seqs, self._row.shape[1])))


def serve_null(model: str = "minilm", port: str = "0") -> None:
    """The server process of `model` (loaded once, for its spec) behind a `NullEngine`."""
    from embedserve.options import EngineOptions
    from embedserve.server import main as server_main

    load = server_main.load_engine
    server_main.load_engine = lambda options: NullEngine(load(options))
    config = server_main.ServerConfig(EngineOptions(model=model), port=int(port))
    sys.exit(server_main.run(config))


def serve_native_null(model: str = "minilm", port: str = "0", name: str = "minilm") -> None:
    """`embedserve serve --native --device cpu` of `model` (as `name`) behind a `NullEngine`."""
    from embedserve.cli.main import main
    from embedserve.cli.native_restarts import NATIVE_CHILD_ENV
    from embedserve.server import main as server_main

    # served in this process, the engine patched below (not by a child `serve --native` starts)
    os.environ[NATIVE_CHILD_ENV] = "1"
    load = server_main.load_engine
    server_main.load_engine = lambda options: NullEngine(load(options))
    sys.exit(main(["serve", "--native", "--model", f"{name}={model}", "--port", port,
                   "--device", "cpu"]))  # fmt: skip
