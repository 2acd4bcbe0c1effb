"""A model's device memory: stated by its server once loaded, or estimated before it loads
(the numbers `embedserve.memory.check_fits` adds up for several models on one GPU)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import torch

from embedserve.engine.attention.masks import padded_bound
from embedserve.engine.placement import DTYPES
from embedserve.engine.weights import load_weights_file, weight_files
from embedserve.loading.spec import ModelSpec
from embedserve.memory import ModelMemory, batch_bytes


def spec_batch_bytes(spec: ModelSpec, tokens: int, element_bytes: int) -> int:
    """The largest batch buffers of `spec`'s model at a budget of `tokens` (`memory.batch_bytes`,
    the padded attention buffer bounded by `masks.padded_bound` at the longest sequence)."""
    cfg: Any = spec.config
    head_dim = getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_heads)
    length = min(tokens, spec.max_seq_length)
    attention = padded_bound(tokens, length, cfg.num_heads, head_dim)
    return batch_bytes(tokens, cfg.hidden_size, cfg.intermediate_size, attention, element_bytes)


def checkpoint_elements(folder: Path) -> int:
    """Numbers in the folder's checkpoint: from the safetensors files' headers alone (nothing
    loaded); a pickled one (`pytorch_model.bin`) is memory-mapped and counted."""
    _, files = weight_files(folder)
    total = 0
    for path in files:
        if path.suffix != ".safetensors":
            total += sum(t.numel() for t in load_weights_file(path).values())
            continue
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def estimate(spec: ModelSpec, name: str, device: str, dtype: str, tokens: int) -> ModelMemory:
    """Before a server loads: its weights in the serving dtype and its batch buffers; its
    workspace is measured once loaded (`stated`), counted 0 here."""
    element = torch.empty((), dtype=DTYPES[dtype]).element_size()
    weights = checkpoint_elements(spec.path) * element
    return ModelMemory(name, device, weights, 0, spec_batch_bytes(spec, tokens, element))


def stated(
    engine: Any, name: str, tokens: int, reserved_before: int = 0
) -> tuple[ModelMemory, dict[str, int]]:
    """A loaded, warmed-up engine's memory (weights counted from its tensors; workspace: what
    the device holds for this process beyond them, 0 on the CPU), and on CUDA the device's
    `free_bytes` and this engine's `reserved_bytes` now (for the next model's check): what this
    process reserves on the device beyond `reserved_before`, the engines built before it in the
    same process (`reserved_on_gpus`)."""
    modules = [engine.model, engine.score_head, engine.dense, engine.retrieval]
    weights = sum(
        t.numel() * t.element_size()
        for m in modules
        if m is not None
        for t in (*m.parameters(), *m.buffers())
    ) + getattr(engine.model, "weight_bytes", 0)  # an executor outside torch (`onnx_encoder`)
    element = torch.empty((), dtype=engine.dtype).element_size()
    device = engine.device
    device_now: dict[str, int] = {}
    workspace = 0
    if device.type == "cuda":
        reserved = int(torch.cuda.memory_reserved(device)) - reserved_before
        workspace = max(0, reserved - weights)
        device_now = {
            "free_bytes": int(torch.cuda.mem_get_info(device)[0]),
            "reserved_bytes": reserved,
        }
    memory = ModelMemory(
        name, str(device), weights, workspace, spec_batch_bytes(engine.spec, tokens, element)
    )
    return memory, device_now


def reserved_on_gpus() -> dict[int, int]:
    """What this process reserves on each visible GPU now, by index (none without CUDA): the
    engines built so far, before the next one's `stated`."""
    if not torch.cuda.is_available():
        return {}
    return {i: int(torch.cuda.memory_reserved(i)) for i in range(torch.cuda.device_count())}
