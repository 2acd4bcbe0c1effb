"""`embedserve serve | server | gateway`: starting the serving processes.

`server` runs one gRPC server (one engine), `gateway` the HTTP front for one or more servers, and
`serve` both on one machine: it starts `--replicas` server processes per `--model` (several
models: each its own servers, one gateway in front of all), waits until each is ready
(its ready record: address and batch budget, `processes.write_ready`), starts the gateway in
front of them, and on Ctrl-C / SIGTERM stops the gateway first (it drains
in-flight requests) and then the servers.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace

from embedserve.gateway.main import GatewayConfig
from embedserve.gateway.models import split_named
from embedserve.gateway.served import default_names
from embedserve.options import Options, option
from embedserve.processes import Child, exit_with_parent, say, write_ready
from embedserve.server.main import ServerConfig

MAX_RESTARTS_PER_MINUTE = 3


@dataclass(frozen=True)
class ServeConfig(Options):
    """What `serve` adds to a server's and a gateway's flags."""

    num_replicas: int = option(
        0,
        "server processes; 0: one per visible GPU with --device auto (one on the CPU); more "
        "than the GPUs share them round-robin",
        flag="replicas",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_replicas < 0:
            raise ValueError(
                f"--replicas must be 0 (one per GPU) or positive, got {self.num_replicas}"
            )


# `serve`'s servers listen on 127.0.0.1, any free port; its --host / --port are the gateway's;
# --cpu-threads is set by the sharing rule (several models on the CPU).
SERVE_SERVER_FIXED = ("host", "port", "cpu_threads")
# --model is the gateway's, repeatable: each server gets its model's.
SERVE_ENGINE_FIXED = ("model",)
# The gateway's replicas are the servers; --drain-seconds and --link-secret-file are theirs, shared.
SERVE_GATEWAY_FIXED = ("replicas", "drain_seconds", "link_secret_file", "otlp_endpoint")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register the serving subcommands."""
    serve = sub.add_parser("serve", help="serve a model over HTTP: servers + gateway, one command")
    ServerConfig.add_arguments(serve, skip=(*SERVE_SERVER_FIXED, *SERVE_ENGINE_FIXED))
    GatewayConfig.add_arguments(serve, skip=SERVE_GATEWAY_FIXED)
    ServeConfig.add_arguments(serve)
    serve.set_defaults(run=run_serve)

    server = sub.add_parser("server", help="run one gRPC server (one engine)")
    ServerConfig.add_arguments(server)
    server.set_defaults(run=run_server)

    gateway = sub.add_parser("gateway", help="run the HTTP gateway in front of gRPC servers")
    GatewayConfig.add_arguments(gateway)
    gateway.set_defaults(run=run_gateway)


# How long past its drain a server or gateway that `serve` started waits, once `serve` is gone,
# before it kills itself and its workers (`processes.exit_with_parent`).
ORPHAN_GRACE_SECONDS = 10.0


def run_server(args: argparse.Namespace) -> int:
    from embedserve.server.main import run

    config = ServerConfig.from_args(args)
    exit_with_parent(config.drain_seconds + ORPHAN_GRACE_SECONDS)
    return run(config)


def run_gateway(args: argparse.Namespace) -> int:
    from embedserve.gateway.main import run

    config = GatewayConfig.from_args(args)
    exit_with_parent(config.drain_seconds + ORPHAN_GRACE_SECONDS)
    return run(config)


def visible_gpus() -> int:
    """CUDA devices this process may use; 0 without touching torch where no NVIDIA driver is
    loaded (the CPU machines: importing torch costs the launcher a second or two)."""
    if not os.path.exists("/dev/nvidiactl") and not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return 0
    import torch  # the launcher only; neither the gateway nor its workers import this

    return int(torch.cuda.device_count())


def _server_devices(device: str, replicas: int) -> list[str]:
    """Each server's device: with --device auto, GPUs round-robin (`replicas` 0: one server per
    visible GPU, or one on the CPU when there is none); any other device for every server."""
    if device != "auto" or replicas == 1:
        return [device] * max(replicas, 1)
    count = visible_gpus()
    if replicas == 0:
        replicas = max(count, 1)
    return [f"cuda:{i % count}" for i in range(replicas)] if count else ["cpu"] * replicas


def serve_configs(args: argparse.Namespace) -> tuple[list[ServerConfig], GatewayConfig]:
    """`serve`'s flags as each server replica's config (its model and device; its metrics on
    PORT+i, or any free port) and the gateway's, whose replicas are the servers' addresses
    (`HOST:0` until they are up; `NAME=HOST:0` with several models). Validates every flag
    before anything starts."""
    num_replicas = ServeConfig.from_args(args).num_replicas
    server = ServerConfig.from_args(args, host=ServerConfig.host, port=0)  # any free port
    models = tuple(args.models) if args.models else GatewayConfig.models
    devices = _server_devices(server.engine.device, num_replicas)
    several = len(models) > 1
    servers, replicas = [], []
    for name, model in (split_named(m) for m in models):
        threads = None
        if several and all(d == "cpu" for d in devices):  # the rule in docs/serving.md
            threads = max(1, (os.cpu_count() or 1) // len(models))
        for device in devices:
            servers.append(
                replace(
                    server,
                    engine=replace(server.engine, model=model, device=device),
                    metrics_port=server.metrics_port and server.metrics_port + len(servers),
                    cpu_threads=threads,
                )
            )
            prefix = f"{name or default_names(model)[0]}=" if several else ""
            replicas.append(f"{prefix}{server.host}:{server.port}")
    return servers, GatewayConfig.from_args(args, replicas=tuple(replicas))


def run_serve(args: argparse.Namespace) -> int:
    configs, gateway = serve_configs(args)
    if gateway.port:  # the HTTP port, before any model loads: a taken port fails in a second
        from embedserve.gateway.main import bind

        bind(gateway.host, gateway.port).close()
    cli = [sys.executable, "-m", "embedserve.cli.main"]
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop_requested.set()

    def start_server(i: int) -> Child:
        argv = [*cli, "server", *configs[i].to_argv()]
        return Child(argv, name=f"server-{i}", relay=sys.stderr)

    servers: list[Child] = []
    gateway_proc: Child | None = None

    def forward_reload(signum: int, frame: object) -> None:  # API keys read again
        if gateway_proc is not None:
            gateway_proc.signal(signal.SIGHUP)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, forward_reload)
    try:
        servers = [start_server(i) for i in range(len(configs))]
        addresses, budgets = [], []
        # with several models, a replica is NAME=HOST:PORT: keep each server's NAME=
        prefixes = [r.rpartition("=")[0] + "=" if "=" in r else "" for r in gateway.replicas]
        for s in servers:  # each server's ready record (`server.main.serve`)
            ready = s.wait_ready(600, cancel=stop_requested)
            s.forget_output()
            addresses.append(str(ready["address"]))
            budgets.append(int(ready["max_batch_tokens"]))
        # A restarted server takes the same port: the gateway's health checks take it back.
        configs = [
            replace(c, port=int(a.rsplit(":", 1)[1]))
            for c, a in zip(configs, addresses, strict=True)
        ]
        gateway = replace(
            gateway, replicas=tuple(p + a for p, a in zip(prefixes, addresses, strict=True))
        )
        if gateway.part_tokens is None:  # a part of a request is one batch of the servers'
            gateway = replace(gateway, part_tokens=min(budgets))
        gateway_proc = Child(
            [*cli, "gateway", *gateway.to_argv()], name="gateway", relay=sys.stderr
        )
        ready = gateway_proc.wait_ready(120, cancel=stop_requested)
        url = str(ready["url"])
        gateway_proc.forget_output()
        served = ", ".join(e.names[0] for e in gateway.entries)
        say(f"embedserve: serving {served} at {url}")
        grpc_address = {k: ready[k] for k in ("tei_grpc",) if k in ready}
        for address in grpc_address.values():
            say(f"embedserve: TEI's gRPC API at {address}")
        write_ready({"url": url, "replicas": addresses, **grpc_address})
        restarts: list[list[float]] = [[] for _ in servers]
        while not stop_requested.wait(0.2):
            if gateway_proc.proc.poll() is not None:
                code = gateway_proc.proc.returncode
                say(f"embedserve: the gateway exited ({code}); shutting down")
                return 1
            for i, s in enumerate(servers):
                if s.proc.poll() is not None:
                    now = time.monotonic()
                    restarts[i] = [t for t in restarts[i] if now - t < 60] + [now]
                    if len(restarts[i]) > MAX_RESTARTS_PER_MINUTE:
                        say(f"embedserve: {s.name} keeps exiting; shutting down")
                        return 1
                    say(f"embedserve: {s.name} exited ({s.proc.returncode}); restarting")
                    servers[i] = start_server(i)
                    servers[i].forget_output()
        say("embedserve: stopping (draining in-flight requests)")
        return 0
    except (RuntimeError, TimeoutError) as e:  # a child exited or hung before it was ready
        say(f"embedserve serve: error: {e}", err=True)
        return 1
    finally:
        # The gateway first: it finishes its requests while the servers still answer.
        if gateway_proc is not None:
            gateway_proc.stop(gateway.drain_seconds + 10)
        for s in servers:
            s.stop(gateway.drain_seconds + 10)
