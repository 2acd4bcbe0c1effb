"""Whether a model fits on its GPU beside the models already loaded there: `serve` checks each
before it loads (the Python path's servers, the native process's engines), against what those
stated of their memory when ready (`engine.memory.stated`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from embedserve.memory import ModelMemory, check_fits
from embedserve.server.main import ServerConfig


def _gpu(device: str) -> str:
    return "cuda:0" if device == "cuda" else device


def same_gpu(device: str, config: ServerConfig) -> bool:
    return device.startswith("cuda") and _gpu(device) == _gpu(config.engine.device)


def check_memory(config: ServerConfig, name: str, beside: list[tuple[str, dict[str, Any]]]) -> None:
    """A ValueError when the model of `config`, served as `name`, does not fit on its GPU beside
    the servers `beside` (served name, ready record) already there (`memory.check_fits`): the
    device's free memory without them is the last one's reading plus what each had reserved."""
    stated = [r for _, r in beside if "free_bytes" in r]
    memories = [
        replace(ModelMemory.from_dict(r["memory"]), model=n) for n, r in beside if "free_bytes" in r
    ]
    if not config.engine.device.startswith("cuda") or not stated:
        return  # the CPU, or the first model on this GPU
    from embedserve.engine.graphs import GraphConfig
    from embedserve.engine.memory import estimate
    from embedserve.loading.bundled import resolve_model
    from embedserve.loading.spec import read_model_spec

    engine = config.engine
    spec = read_model_spec(
        resolve_model(engine.model), pooling=engine.pooling, attention=engine.attention
    )
    tokens = config.max_batch_tokens or GraphConfig().max_tokens
    device = _gpu(engine.device)
    need = estimate(spec, name, device, engine.dtype or "bfloat16", tokens)
    free = int(stated[-1]["free_bytes"]) + sum(int(r["reserved_bytes"]) for r in stated)
    check_fits(device, free, memories, need)
