"""`embedserve serve | server | gateway`: starting the serving processes.

`server` runs one gRPC server (one engine), `gateway` the HTTP front for one or more servers, and
`serve` both on one machine: it starts `--replicas` server processes, waits until each is ready,
starts the gateway in front of them, and on Ctrl-C / SIGTERM stops the gateway first (it drains
in-flight requests) and then the servers.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence

from embedserve.bundled import BUNDLED, DEFAULT_MODEL
from embedserve.processes import Child

SERVER_READY = re.compile(r"embedserve server: ready on (\S+):(\d+)")
MAX_RESTARTS_PER_MINUTE = 3
GATEWAY_READY = re.compile(r"embedserve gateway: listening on (\S+) ")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    known = ", ".join(f"{k}: {v[1]}" for k, v in BUNDLED.items())
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model folder or bundled name ({known})")


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--dtype", default=None, help="float32 (CPU default) | bfloat16 (GPU default)")
    p.add_argument("--pooling", default=None, choices=["mean", "cls", "last"])
    p.add_argument("--attention", default=None, help="attention backend (default: measured)")
    p.add_argument(
        "--attention-kind",
        default=None,
        choices=["causal", "bidirectional"],
        help="override the folder's attention (Qwen3 models; default: what the folder declares)",
    )
    p.add_argument(
        "--max-batch-tokens", type=int, default=16384, help="token budget of one engine batch"
    )
    p.add_argument(
        "--max-queued-tokens",
        type=int,
        default=262144,
        help="refuse new requests (RESOURCE_EXHAUSTED / HTTP 429) beyond this many queued tokens",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the server's Prometheus metrics (graph captures, replays, padding, queue) "
        "on this port; 0 picks a free one; with serve, replica i uses PORT+i (default: off)",
    )
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=None,
        help="how long a batch may wait for the clients of the previous batch to come back "
        "(default: 3 on the CPU, 0 on a GPU)",
    )


def _add_gateway_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=1, help="gateway processes on the one port")
    p.add_argument(
        "--served-model-name",
        action="append",
        default=None,
        help="name(s) clients use for the model (default: the bundled name or folder name)",
    )
    p.add_argument("--max-body-bytes", type=int, default=16 << 20, help="HTTP 413 above this")
    p.add_argument("--max-inputs", type=int, default=2048, help="inputs (documents) per request")
    p.add_argument(
        "--max-chunks-per-document",
        type=int,
        default=1024,
        help="chunks per document of a contextualized-embeddings request",
    )
    p.add_argument("--max-tokens-per-request", type=int, default=300_000)
    p.add_argument(
        "--chunk-tokens", type=int, default=8192, help="split requests into chunks of this size"
    )
    p.add_argument(
        "--request-timeout", type=float, default=30.0, help="deadline of each server call (s)"
    )
    p.add_argument("--health-interval", type=float, default=0.5, help="replica health poll (s)")


def _add_drain(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--drain-seconds", type=float, default=30.0, help="how long a stop waits for requests"
    )


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register the serving subcommands."""
    serve = sub.add_parser("serve", help="serve a model over HTTP: servers + gateway, one command")
    _add_model_args(serve)
    _add_engine_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--replicas", type=int, default=1, help="server processes (one per GPU)")
    _add_gateway_args(serve)
    _add_drain(serve)
    serve.set_defaults(run=run_serve)

    server = sub.add_parser("server", help="run one gRPC server (one engine)")
    _add_model_args(server)
    _add_engine_args(server)
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=50051, help="gRPC port (0: any free port)")
    _add_drain(server)
    server.set_defaults(run=run_server)

    gateway = sub.add_parser("gateway", help="run the HTTP gateway in front of gRPC servers")
    gateway.add_argument(
        "--replica", action="append", required=True, help="a server's HOST:PORT (repeatable)"
    )
    _add_model_args(gateway)
    gateway.add_argument("--host", default="127.0.0.1")
    gateway.add_argument("--port", type=int, default=8000, help="HTTP port (0: any free port)")
    _add_gateway_args(gateway)
    _add_drain(gateway)
    gateway.set_defaults(run=run_gateway)


def run_server(args: argparse.Namespace) -> int:
    from embedserve.server.main import ServerConfig, run

    return run(
        ServerConfig(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            pooling=args.pooling,
            attention=args.attention,
            attention_kind=args.attention_kind,
            host=args.host,
            port=args.port,
            max_batch_tokens=args.max_batch_tokens,
            max_queued_tokens=args.max_queued_tokens,
            drain_seconds=args.drain_seconds,
            batch_wait_ms=args.batch_wait_ms,
            metrics_port=args.metrics_port,
        )
    )


def _gateway_config(args: argparse.Namespace, replicas: Sequence[str]):  # type: ignore[no-untyped-def]
    from embedserve.gateway.main import GatewayConfig

    return GatewayConfig(
        replicas=tuple(replicas),
        model=args.model,
        served_model_names=tuple(args.served_model_name or ()),
        host=args.host,
        port=args.port,
        workers=args.workers,
        max_body_bytes=args.max_body_bytes,
        max_inputs=args.max_inputs,
        max_chunks_per_document=args.max_chunks_per_document,
        max_tokens_per_request=args.max_tokens_per_request,
        chunk_tokens=args.chunk_tokens,
        request_timeout=args.request_timeout,
        health_interval=args.health_interval,
        drain_seconds=args.drain_seconds,
    )


def run_gateway(args: argparse.Namespace) -> int:
    from embedserve.gateway.main import run

    return run(_gateway_config(args, args.replica))


def _server_devices(device: str, replicas: int) -> list[str]:
    if replicas == 1 or device != "auto":
        return [device] * replicas
    import torch  # the launcher only; neither the gateway nor its workers import this

    count = torch.cuda.device_count()
    return [f"cuda:{i % count}" for i in range(replicas)] if count else ["cpu"] * replicas


def run_serve(args: argparse.Namespace) -> int:
    if args.replicas <= 0:
        raise ValueError(f"--replicas must be positive, got {args.replicas}")
    _gateway_config(args, ["127.0.0.1:1"])  # validate gateway flags before starting anything
    cli = [sys.executable, "-m", "embedserve.cli"]
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop_requested.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    servers: list[Child] = []
    gateway: Child | None = None
    try:
        for i, device in enumerate(_server_devices(args.device, args.replicas)):
            argv = [*cli, "server", "--model", args.model, "--device", device, "--port", "0"]
            argv += ["--max-batch-tokens", str(args.max_batch_tokens)]
            argv += ["--max-queued-tokens", str(args.max_queued_tokens)]
            argv += ["--drain-seconds", str(args.drain_seconds)]
            if args.batch_wait_ms is not None:
                argv += ["--batch-wait-ms", str(args.batch_wait_ms)]
            if args.metrics_port is not None:
                argv += ["--metrics-port", str(args.metrics_port + i if args.metrics_port else 0)]
            for flag in ("dtype", "pooling", "attention", "attention_kind"):
                if getattr(args, flag) is not None:
                    argv += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
            servers.append(Child(argv, name=f"server-{i}", relay=sys.stderr))
        addresses = []
        for s in servers:
            m = s.wait_for(SERVER_READY, 600, cancel=stop_requested)
            s.forget_output()
            addresses.append(f"{m.group(1)}:{m.group(2)}")
        argv = [*cli, "gateway", "--model", args.model, "--host", args.host]
        argv += ["--port", str(args.port), "--workers", str(args.workers)]
        for a in addresses:
            argv += ["--replica", a]
        for name in args.served_model_name or ():
            argv += ["--served-model-name", name]
        for flag in (
            "max_body_bytes",
            "max_inputs",
            "max_chunks_per_document",
            "max_tokens_per_request",
            "chunk_tokens",
            "request_timeout",
            "health_interval",
            "drain_seconds",
        ):
            argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        gateway = Child(argv, name="gateway", relay=sys.stderr)
        url = gateway.wait_for(GATEWAY_READY, 120, cancel=stop_requested).group(1)
        gateway.forget_output()
        print(f"embedserve: serving {args.model} at {url}", flush=True)
        restarts: list[list[float]] = [[] for _ in servers]
        while not stop_requested.wait(0.2):
            if gateway.proc.poll() is not None:
                code = gateway.proc.returncode
                print(f"embedserve: the gateway exited ({code}); shutting down", flush=True)
                return 1
            for i, s in enumerate(servers):
                if s.proc.poll() is not None:
                    now = time.monotonic()
                    restarts[i] = [t for t in restarts[i] if now - t < 60] + [now]
                    if len(restarts[i]) > MAX_RESTARTS_PER_MINUTE:
                        print(f"embedserve: {s.name} keeps exiting; shutting down", flush=True)
                        return 1
                    # Restart on the same port; the gateway's health checks take it back.
                    print(
                        f"embedserve: {s.name} exited ({s.proc.returncode}); restarting", flush=True
                    )
                    argv = [*s.argv]
                    argv[argv.index("--port") + 1] = addresses[i].rsplit(":", 1)[1]
                    servers[i] = Child(argv, name=s.name, relay=sys.stderr)
                    servers[i].forget_output()
        print("embedserve: stopping (draining in-flight requests)", flush=True)
        return 0
    except (RuntimeError, TimeoutError) as e:  # a child exited or hung before it was ready
        print(f"embedserve serve: error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        # The gateway first: it finishes its requests while the servers still answer.
        if gateway is not None:
            gateway.stop(args.drain_seconds + 10)
        for s in servers:
            s.stop(args.drain_seconds + 10)
