"""What several models' servers on one machine may take: a GPU's memory, the CPU's cores.

Pure arithmetic over the numbers the servers state (no torch), so CI checks the rules on the
CPU:

- **GPU memory.** Each server states its memory at start-up (`engine.memory`, in its ready
  record and log): its weights, its workspace (what the device holds for it beyond the
  weights once warmed up: CUDA graphs' pool, kernels' scratch) and its largest batch buffers
  (the activations of one batch at the token budget). Before `serve` loads the next model on a
  GPU, `check_fits` adds up the statements of the servers already there and the next model's
  estimate against the memory that device had free without them; a model that does not fit
  stops the start with an error naming it and the shortfall.
- **CPU cores.** `cpu_thread_shares`: with several models on the CPU, each server gets an
  equal share of the cores, at least one, and a server given its own `cpu_threads` keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

GIB = 1 << 30


@dataclass(frozen=True)
class ModelMemory:
    """One server's device memory, stated at start-up (or estimated before it loads)."""

    model: str  # the served name
    device: str  # "cuda:0", "cpu"
    weights_bytes: int
    workspace_bytes: int
    batch_bytes: int  # the largest batch's activations at the server's token budget

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.workspace_bytes + self.batch_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_bytes": self.total_bytes}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> ModelMemory:
        return cls(**{k: record[k] for k in cls.__dataclass_fields__})

    def describe(self) -> str:
        return (
            f"{_gib(self.total_bytes)}: weights {_gib(self.weights_bytes)}, workspace "
            f"{_gib(self.workspace_bytes)}, batches {_gib(self.batch_bytes)}"
        )


def batch_bytes(
    tokens: int, hidden: int, intermediate: int, attention_elements: int, element_bytes: int
) -> int:
    """The activations alive at once in one layer of a batch of `tokens`: the layer's input and
    output, Q, K, V and the attention output (6 x hidden per token), the feed-forward's two
    intermediate tensors (its input to the activation and the activation's output), and the
    largest attention buffer of a padded backend (`attention_elements`, `masks.padded_bound`)."""
    per_token = 6 * hidden + 2 * intermediate
    return (tokens * per_token + attention_elements) * element_bytes


def check_fits(
    device: str, free_bytes: int, loaded: Sequence[ModelMemory], next_model: ModelMemory
) -> None:
    """A ValueError when `next_model` does not fit on `device` beside the `loaded` ones, whose
    servers and it share `free_bytes` (the device's free memory without any of them)."""
    used = sum(m.total_bytes for m in loaded)
    need = used + next_model.total_bytes
    if need <= free_bytes:
        return
    beside = ", ".join(f"{m.model!r} ({_gib(m.total_bytes)})" for m in loaded) or "nothing of ours"
    raise ValueError(
        f"model {next_model.model!r} does not fit on {device}: it needs "
        f"{next_model.describe()}; beside {beside} the models need {_gib(need)} of the "
        f"{_gib(free_bytes)} free there, {_gib(need - free_bytes)} short. Lower its "
        "max_batch_tokens, give it another device, or a smaller dtype"
    )


def cpu_thread_shares(cores: int, stated: Sequence[int | None]) -> list[int]:
    """Each CPU server's threads: its own where `stated`, else an equal share of the cores the
    stated ones leave (at least one each)."""
    left = cores - sum(s for s in stated if s is not None)
    unstated = sum(1 for s in stated if s is None)
    share = max(1, left // unstated) if unstated else 0
    return [share if s is None else s for s in stated]


# the environment variable that sizes the tokenizer's thread pool (Rust's rayon) in a process
TOKENIZER_POOL = "RAYON_NUM_THREADS"


def tokenizer_threads(cores: int | None, workers: int) -> int:
    """A gateway worker's share of the cores for its tokenizer's pool. NOTE: by default each
    worker's pool has a thread per core: 8 workers on the H200 host's 16 cores ran 128 of them.
    The isolation runs that first favoured this share (concurrency-h200-isolation-20261202-7:
    7.38x, -8: 1.62x) were later found confounded by the order of runs (-9 to -18 fall in a good
    and a bad state whatever the pool); it is kept as the share that cannot oversubscribe the
    cores, not as a measured gain."""
    return max(1, (cores or 1) // workers)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
