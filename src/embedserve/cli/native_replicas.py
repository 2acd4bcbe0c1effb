"""The native front in front of server processes: `embedserve gateway` (its default), and so
`serve` with several engines for a model (`--replicas` over 1, an engine per GPU of a host of
several), where `cli/native.py`'s one process cannot hold them all.

Ivy reads every HTTP request and sends each part of a plain one to the server with the fewest
tokens outstanding (`native/src/link`): over its unix socket when it is on this host and
listening, else over gRPC; every other request goes to the gateway's own app, run here on an
event loop of its own thread (`gateway/native_front.py`), whose replica pool calls the same
servers (health, `/ready`, its retry and its errors). Each server keeps its own queue,
scheduler and metrics port.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

from embedserve.cli.native import LANE_RULE, PythonSide, native_gateway
from embedserve.cli.native_models import Answered, served_model, served_spec
from embedserve.contract.local import local_socket_for
from embedserve.gateway.main import GatewayConfig
from embedserve.gateway.replicas import NATIVE_SENT, is_source
from embedserve.processes import say, write_ready


def replica_targets(gateway: GatewayConfig) -> list[list[str]] | str:
    """Each model's servers as Ivy reaches them, in the order of its replicas: a unix socket's
    path (a server on this host, listening, ours), else its `HOST:PORT`; or why the native
    front cannot serve them (a `dns:` or `file:` source, whose servers come and go: the Python
    gateway's pool follows them)."""
    targets = []
    for entry in gateway.entries:
        sources = [a for a in entry.replicas if is_source(a)]
        if sources:
            return f"replicas {', '.join(sources)} come and go (the Python gateway follows them)"
        local = [local_socket_for(address) for address in entry.replicas]
        targets.append([str(p) if p else a for p, a in zip(local, entry.replicas, strict=True)])
    return targets


def run_native_front(gateway: GatewayConfig, targets: list[list[str]]) -> int:
    """Serve in front of the gateway's replicas (`replica_targets`) until SIGTERM / Ctrl-C
    (0). Each model's part tokens are its own (`serve` sets them to its servers' batch)."""
    from embedserve.contract.secret import read_secret
    from embedserve.gateway.main import build_app

    models = [served_model(gateway, entry) for entry in gateway.entries]
    side = PythonSide(gateway)
    specs = [
        _linked_spec(entry, model, replicas)
        for entry, model, replicas in zip(gateway.entries, models, targets, strict=True)
    ]
    secret = read_secret(gateway.link_secret_file) if gateway.link_secret_file else None
    # the servers take the lane each part is sent in (`EmbedRequest.lane`), under their --lanes
    native = native_gateway(
        gateway, specs, side.front, sorted(side.keys()), LANE_RULE, link_secret=secret
    )
    for i, entry in enumerate(gateway.entries):  # Ivy's calls, in the pool's counts too
        for j, address in enumerate(entry.replicas):
            NATIVE_SENT[address] = functools.partial(_sent, native, i, j)
    # its replica pool: the same servers and sockets; one Python front (--workers: Ivy's
    # threads here), so the result cache holds all of --cache-size
    app = build_app(dataclasses.replace(gateway, workers=1), side.keys)
    grpc_address = side.start(native, app, gateway)
    _say_ready(gateway, native, models, targets, grpc_address)
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C while draining
        native.serve()
    side.stop()
    return 0


def _sent(native: Any, model: int, replica: int) -> int:
    return int(native.replica_tokens(model)[replica])


def _linked_spec(entry: Any, model: tuple[Any, Answered], replicas: list[str]) -> Any:
    """One model as Ivy serves it over its servers: a cross-encoder's scores are the Python
    front's here (Ivy sends a part's texts alone); each server bounds its own queue."""
    from embedserve.gateway.main import part_tokens

    inputs, answered = model
    answered = dataclasses.replace(answered, reranker=None)
    return served_spec(entry, (inputs, answered), None, part_tokens(entry),
                       replicas=tuple(replicas))  # fmt: skip


def _say_ready(
    gateway: GatewayConfig,
    native: Any,
    models: list[tuple[Any, Answered]],
    targets: list[list[str]],
    grpc: str | None,
) -> None:
    """What Ivy answers of each model and over how many servers, and the ready record the
    launcher reads (`processes.write_ready`); the launcher says where `serve` serves."""
    each = []
    for entry, (_, answered), replicas in zip(gateway.entries, models, targets, strict=True):
        what = "embeddings" if answered.embeddings else "sparse vectors" if answered.sparse else ""
        how = f"plain {what} answered natively" if what else "through the Python front"
        each.append(f"{entry.names[0]}: {how} over {len(replicas)} servers")
    url = f"http://{gateway.host}:{native.port}"
    say(f"embedserve gateway: listening on {url} (native front: {'; '.join(each)})")
    record: dict[str, Any] = {"url": url}
    if grpc is not None:
        record["tei_grpc"] = grpc
    write_ready(record)
