"""The native front in front of server processes: `serve` with several engines for a model
(`--replicas` over 1, an engine per GPU of a host of several), where `cli/native.py`'s one
process cannot hold them all.

`serve`'s launcher starts the server processes as on the Python path (`cli/launch.py`), then
this front in place of the Python gateway: Ivy reads every HTTP request and sends each part of
a plain one to the server with the fewest tokens outstanding, over its unix socket
(`native/src/link`); every other request goes to the gateway's own app, run here on an event
loop of its own thread (`gateway/native_front.py`), whose replica pool calls the same servers.
Each server keeps its own queue, scheduler and metrics port.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from embedserve.cli.native import LANE_RULE, PythonSide, native_gateway
from embedserve.cli.native_models import Answered, served_model, served_spec
from embedserve.contract.local import local_socket_for
from embedserve.gateway.main import GatewayConfig
from embedserve.processes import say, write_ready

# set by `serve`'s launcher for its gateway process: it runs this front (`run_native_front`)
NATIVE_FRONT_ENV = "EMBEDSERVE_NATIVE_FRONT"


def replica_sockets(gateway: GatewayConfig) -> list[list[Path]] | str:
    """Each model's servers' unix sockets, in the order of its replicas; or why the front
    cannot reach them natively (a server not on this host, or with no socket of ours)."""
    sockets = []
    for entry in gateway.entries:
        paths = [local_socket_for(address) for address in entry.replicas]
        if not paths or None in paths:
            return f"model {entry.names[0]}: a replica has no unix socket on this host"
        sockets.append([p for p in paths if p is not None])
    return sockets


def run_native_front(gateway: GatewayConfig) -> int:
    """Serve in front of the gateway's replicas until SIGTERM / Ctrl-C (0). Each model's part
    tokens are the gateway's (`serve` sets them to its servers' batch)."""
    from embedserve.gateway.main import build_app

    sockets = replica_sockets(gateway)
    if isinstance(sockets, str):
        raise ValueError(f"the native front cannot reach the servers: {sockets}")
    models = [served_model(gateway, entry) for entry in gateway.entries]
    side = PythonSide(gateway)
    specs = [
        _linked_spec(entry, model, paths)
        for entry, model, paths in zip(gateway.entries, models, sockets, strict=True)
    ]
    # the servers take the lane each part is sent in (`EmbedRequest.lane`), under their --lanes
    native = native_gateway(gateway, specs, side.front, sorted(side.keys()), LANE_RULE)
    app = build_app(gateway, side.keys)  # its replica pool: the same servers and sockets
    grpc_address = side.start(native, app, gateway)
    _say_ready(gateway, native, models, sockets, grpc_address)
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C while draining
        native.serve()
    side.stop()
    return 0


def _linked_spec(entry: Any, model: tuple[Any, Answered], paths: list[Path]) -> Any:
    """One model as Ivy serves it over its servers: a cross-encoder's scores are the Python
    front's here (Ivy sends a part's texts alone); each server bounds its own queue."""
    from embedserve.gateway.main import part_tokens

    inputs, answered = model
    answered = dataclasses.replace(answered, reranker=None)
    return served_spec(entry, (inputs, answered), None, part_tokens(entry),
                       replicas=tuple(str(p) for p in paths))  # fmt: skip


def _say_ready(
    gateway: GatewayConfig,
    native: Any,
    models: list[tuple[Any, Answered]],
    sockets: list[list[Path]],
    grpc: str | None,
) -> None:
    """What Ivy answers of each model and over how many servers, and the ready record the
    launcher reads (`processes.write_ready`); the launcher says where `serve` serves."""
    each = []
    for entry, (_, answered), paths in zip(gateway.entries, models, sockets, strict=True):
        what = "embeddings" if answered.embeddings else "sparse vectors" if answered.sparse else ""
        how = f"plain {what} answered natively" if what else "through the Python front"
        each.append(f"{entry.names[0]}: {how} over {len(paths)} servers")
    url = f"http://{gateway.host}:{native.port}"
    say(f"embedserve gateway: listening on {url} (native front: {'; '.join(each)})")
    record: dict[str, Any] = {"url": url}
    if grpc is not None:
        record["tei_grpc"] = grpc
    write_ready(record)
