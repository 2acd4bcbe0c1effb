"""The flags `serve` adds to a server's and a gateway's (`ServeConfig`): its own module, so
that `cli.models_file` (a model's `replicas` key is one of them) and `cli.launch` both read it
without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from embedserve.options import Options, option

if TYPE_CHECKING:
    from embedserve.gateway.main import GatewayConfig


@dataclass(frozen=True)
class ServeConfig(Options):
    """What `serve` adds to a server's and a gateway's flags."""

    num_replicas: int = option(
        0,
        "server processes; 0: one per visible GPU with --device auto (one on the CPU); more "
        "than the GPUs share them round-robin",
        flag="replicas",
    )
    config: str | None = option(
        None,
        "a TOML file of the models to serve, each with its own name, device, dtype, replicas "
        'and limits (docs/serving.md, "Several models"); instead of --model',
        metavar="PATH",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_replicas < 0:
            raise ValueError(
                f"--replicas must be 0 (one per GPU) or positive, got {self.num_replicas}"
            )


def with_part_tokens(gateway: GatewayConfig, names: list[str], budgets: list[int]) -> GatewayConfig:
    """The gateway's parts of a request: one batch of the servers (the smallest budget); with
    several models, each model's own servers' (but where a model sets its own part_tokens)."""
    gateway = replace(gateway, part_tokens=min(budgets))
    own = {given.partition(":")[0] for given in gateway.model_limits if ":part_tokens=" in given}
    parts: dict[str, int] = {}
    for name, budget in zip(names, budgets, strict=True):
        parts[name] = min(budget, parts.get(name, budget))
    if len(parts) == 1:
        return gateway
    extra = [f"{n}:part_tokens={b}" for n, b in parts.items() if n not in own]
    return replace(gateway, model_limits=(*gateway.model_limits, *extra))


def served_names(gateway: GatewayConfig) -> list[str]:
    """The model each of `serve_configs`' servers serves, in order: its replica's `NAME=` (with
    several models), else the one model's name."""
    return [r.rpartition("=")[0] or gateway.model_names[0] for r in gateway.replicas]
