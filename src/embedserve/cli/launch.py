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
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from embedserve.cli.gpu_memory import check_memory, same_gpu
from embedserve.cli.models_file import ModelSection, read_models_file
from embedserve.cli.serve_options import ServeConfig, served_names, with_part_tokens
from embedserve.gateway.main import GatewayConfig
from embedserve.gateway.models import split_named
from embedserve.gateway.served import default_names
from embedserve.gpus import visible_gpus
from embedserve.memory import cpu_thread_shares
from embedserve.options import EngineOptions
from embedserve.processes import (
    ORPHAN_GRACE_SECONDS,
    START_TIMEOUT_S,
    Child,
    Restarts,
    exit_with_parent,
    say,
    set_on_signal,
    write_ready,
)
from embedserve.server.main import ServerConfig

# `serve`'s servers listen on 127.0.0.1, any free port; its --host / --port are the gateway's;
# --cpu-threads is set by the sharing rule (several models on the CPU); the gateway's
# --max-multivector-values is theirs too (a field reads the flag of its name).
# --served-name is the name each server's model is served under: serve sets it.
SERVE_SERVER_FIXED = ("host", "port", "cpu_threads", "max_multivector_values", "served_name")
# --model is the gateway's, repeatable: each server gets its model's.
SERVE_ENGINE_FIXED = ("model",)
# The gateway's replicas are the servers; --drain-seconds and --link-secret-file are theirs, shared.
# --model-limit: a models file's limits (`serve --config`).
SERVE_GATEWAY_FIXED = (
    "replicas",
    "drain_seconds",
    "link_secret_file",
    "otlp_endpoint",
    "model_limits",
)


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


def run_server(args: argparse.Namespace) -> int:
    from embedserve.server.main import run

    config = ServerConfig.from_args(args)
    exit_with_parent(config.drain_seconds + ORPHAN_GRACE_SECONDS)
    return run(config)


def run_gateway(args: argparse.Namespace) -> int:
    from embedserve.cli.native_replicas import replica_targets, run_native_front
    from embedserve.gateway.main import run

    config = GatewayConfig.from_args(args)
    exit_with_parent(config.drain_seconds + ORPHAN_GRACE_SECONDS)
    if config.native is not False:
        targets = replica_targets(config)
        if not isinstance(targets, str):
            return run_native_front(config, targets)
        if config.native:
            raise ValueError(f"--native: {targets}")
        say(f"embedserve gateway: the Python gateway, not the native front: {targets}")
    return run(config)


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
    """`serve`'s flags (and its models file) as each server replica's config (its model, device
    and limits; its metrics on PORT+i, or any free port) and the gateway's, whose replicas are
    the servers' addresses (`HOST:0` until they are up; `NAME=HOST:0` with several models).
    Validates every flag and key before anything starts."""
    serve = ServeConfig.from_args(args)
    server = ServerConfig.from_args(args, host=ServerConfig.host, port=0)  # any free port
    sections = _model_sections(args, serve)
    several = len(sections) > 1
    servers: list[ServerConfig] = []
    replicas, limits = [], []
    for section in sections:
        engine = _with(section, server.engine)
        base = replace(_with(section, server), engine=engine)
        count = _with(section, serve).num_replicas
        for device in _server_devices(engine.device, count):
            servers.append(
                replace(
                    base,
                    engine=replace(engine, device=device),
                    metrics_port=server.metrics_port and server.metrics_port + len(servers),
                )
            )
            replicas.append(f"{section.name}=" * several + f"{server.host}:{server.port}")
        for key, value in section.of(GatewayConfig).items():
            if value <= 0:
                raise ValueError(f"{section.where}: key {key!r} must be positive, got {value}")
            limits.append(f"{section.name}:{key}={value}")
    if several:  # the models' CPU servers share the cores (`memory.cpu_thread_shares`)
        on_cpu = [i for i, s in enumerate(servers) if s.engine.device == "cpu"]
        shares = cpu_thread_shares(os.cpu_count() or 1, [servers[i].cpu_threads for i in on_cpu])
        for i, threads in zip(on_cpu, shares, strict=True):
            servers[i] = replace(servers[i], cpu_threads=threads)
    models = tuple(args.models or ()) if serve.config is None else None
    gateway = GatewayConfig.from_args(
        args,
        models=models or tuple(f"{s.name}={s.of(EngineOptions)['model']}" for s in sections),
        replicas=tuple(replicas),
        model_limits=tuple(limits),
    )
    return servers, gateway


def _model_sections(args: argparse.Namespace, serve: ServeConfig) -> list[ModelSection]:
    """The models to serve: the models file's, or each --model's (its model alone)."""
    if serve.config is not None:
        if args.models:
            raise ValueError(f"--config {serve.config} names the models: leave out --model")
        return read_models_file(serve.config)
    sections = []
    for given in args.models or GatewayConfig.models:
        name, model = split_named(given)
        settings: dict[type, dict[str, Any]] = {EngineOptions: {"model": model}}
        sections.append(ModelSection(name or default_names(model)[0], f"--model {given}", settings))
    return sections


def _with(section: ModelSection, config: Any) -> Any:
    """`config` with the model's own values of its fields; a bad one names the model."""
    try:
        return replace(config, **section.of(type(config)))
    except ValueError as e:
        raise ValueError(f"{section.where}: {e}") from None


# how `serve` runs: `serve_mode`'s answers
ONE_PROCESS, NATIVE_FRONT, PYTHON = "one process", "native front", "python"


def serve_mode(servers: list[ServerConfig], gateway: GatewayConfig) -> str:
    """How `serve` runs these flags: the native front and an engine per model in one process
    (`cli/native.py`); several engines for a model: server processes behind the native front
    (`cli/native_replicas.py`); `--no-native`: the Python gateway and server processes."""
    if gateway.native is False:
        return PYTHON
    return ONE_PROCESS if len(servers) == len(gateway.entries) else NATIVE_FRONT


def run_serve(args: argparse.Namespace) -> int:
    configs, gateway = serve_configs(args)
    mode = serve_mode(configs, gateway)
    if gateway.port:  # the HTTP port, before any model loads: a taken port fails in a second
        from embedserve.gateway.sockets import bind

        bind(gateway.host, gateway.port).close()
    if mode == ONE_PROCESS:
        from embedserve.cli.native_restarts import serve_native

        return serve_native(args.given, configs, gateway)
    return _serve_processes(configs, gateway)


def _serve_processes(configs: list[ServerConfig], gateway: GatewayConfig) -> int:
    """Each server and the gateway a process of its own (the gateway the native front in front
    of the servers unless `--no-native`: `cli/native_replicas.py`), started, watched and
    restarted here until SIGTERM / Ctrl-C."""
    cli = [sys.executable, "-m", "embedserve.cli.main"]
    stop_requested = threading.Event()

    def start_server(i: int) -> Child:
        argv = [*cli, "server", *configs[i].to_argv()]
        return Child(argv, name=f"server-{i}", relay=sys.stderr)

    servers: list[Child] = []
    gateway_proc: Child | None = None

    def forward_reload(signum: int, frame: object) -> None:  # API keys read again
        if gateway_proc is not None:
            gateway_proc.signal(signal.SIGHUP)

    signal.signal(signal.SIGTERM, set_on_signal(stop_requested))
    signal.signal(signal.SIGINT, set_on_signal(stop_requested))
    signal.signal(signal.SIGHUP, forward_reload)
    try:
        # with several models, a replica is NAME=HOST:PORT: keep each server's NAME=
        prefixes = [r.rpartition("=")[0] + "=" if "=" in r else "" for r in gateway.replicas]
        names = served_names(gateway)
        configs = [replace(c, served_name=n) for c, n in zip(configs, names, strict=True)]
        readies = start_servers(configs, names, start_server, stop_requested, servers)
        addresses = [str(r["address"]) for r in readies]
        # A restarted server takes the same port: the gateway's health checks take it back.
        configs = [
            replace(c, port=int(a.rsplit(":", 1)[1]))
            for c, a in zip(configs, addresses, strict=True)
        ]
        devices = [c.engine.device for c in configs]
        gateway = _gateway_in_front(gateway, prefixes, names, readies, devices)
        gateway_proc = Child(
            [*cli, "gateway", *gateway.to_argv()], name="gateway", relay=sys.stderr
        )
        ready = gateway_proc.wait_ready(120, cancel=stop_requested)
        gateway_proc.forget_output()
        _announce(ready, gateway, addresses)
        return _supervise(gateway_proc, servers, start_server, stop_requested)
    # a child exited or hung before it was ready; a model did not fit beside another
    except (RuntimeError, TimeoutError, ValueError) as e:
        say(f"embedserve serve: error: {e}", err=True)
        return 1
    finally:
        # The gateway first: it finishes its requests while the servers still answer.
        if gateway_proc is not None:
            gateway_proc.stop(gateway.drain_seconds + 10)
        for s in servers:
            s.stop(gateway.drain_seconds + 10)


def _gateway_in_front(
    gateway: GatewayConfig,
    prefixes: list[str],
    names: list[str],
    readies: list[dict[str, Any]],
    devices: list[str],
) -> GatewayConfig:
    """The gateway's config once its servers are ready: their addresses as its replicas (each
    with its NAME= prefix), and, unless set, a part of a request as one batch of theirs and no
    bound on calls in flight in front of servers all on the CPU (`coalescing.CALLS_IN_FLIGHT`)."""
    if gateway.calls_in_flight is None and all(d == "cpu" for d in devices):
        gateway = replace(gateway, calls_in_flight=0)
    addresses = [str(r["address"]) for r in readies]
    gateway = replace(
        gateway, replicas=tuple(p + a for p, a in zip(prefixes, addresses, strict=True))
    )
    if gateway.part_tokens is None:  # a part of a request is one batch of the servers'
        gateway = with_part_tokens(gateway, names, [int(r["max_batch_tokens"]) for r in readies])
    return gateway


def _announce(ready: dict[str, Any], gateway: GatewayConfig, addresses: list[str]) -> None:
    """What `serve` serves and where, said once the gateway is ready, and its own ready record."""
    url = str(ready["url"])
    served = ", ".join(e.names[0] for e in gateway.entries)
    say(f"embedserve: serving {served} at {url}")
    grpc_address = {k: ready[k] for k in ("tei_grpc",) if k in ready}
    for address in grpc_address.values():
        say(f"embedserve: TEI's gRPC API at {address}")
    write_ready({"url": url, "replicas": addresses, **grpc_address})


def _supervise(
    gateway: Child, servers: list[Child], start: Callable[[int], Child], stop: threading.Event
) -> int:
    """Until `stop`: a server that exits is started again (`servers[i]`), at most `Restarts`'
    times a minute each. 0 on `stop`; 1 when the gateway exits or a server keeps exiting."""
    restarts = [Restarts() for _ in servers]
    while not stop.wait(0.2):
        if gateway.proc.poll() is not None:
            say(f"embedserve: the gateway exited ({gateway.proc.returncode}); shutting down")
            return 1
        for i, s in enumerate(servers):
            if s.proc.poll() is None:
                continue
            if not restarts[i].allow():
                say(f"embedserve: {s.name} keeps exiting; shutting down")
                return 1
            say(f"embedserve: {s.name} exited ({s.proc.returncode}); restarting")
            servers[i] = start(i)
            servers[i].forget_output()
    say("embedserve: stopping (draining in-flight requests)")
    return 0


def start_servers(
    configs: list[ServerConfig],
    names: list[str],
    start: Callable[[int], Child],
    cancel: threading.Event,
    started: list[Child],
) -> list[dict[str, Any]]:
    """Start every server (appended to `started` as it starts) and wait for each one's ready
    record. On the CPU all at once; with GPUs one model after another, each server checked
    before it loads against the statements of the other models' servers already on its device
    (`check_memory`)."""
    waves = [list(range(len(configs)))]
    if any(c.engine.device != "cpu" for c in configs):  # a model's servers are consecutive
        waves = [[i for i, n in enumerate(names) if n == name] for name in dict.fromkeys(names)]
    readies: list[dict[str, Any]] = []
    for wave in waves:
        for i in wave:
            loaded = zip(names, configs, readies, strict=False)
            here = [(n, r) for n, c, r in loaded if same_gpu(c.engine.device, configs[i])]
            check_memory(configs[i], names[i], here)
            started.append(start(i))
        for i in wave:  # its ready record (`server.main.serve`)
            readies.append(started[i].wait_ready(START_TIMEOUT_S, cancel=cancel))
            started[i].forget_output()
    return readies
