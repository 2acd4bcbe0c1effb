"""`serve --one-process`: the gateway and a CPU engine in one process, its steps on the loop.

`serve` runs a gateway and a server as processes of their own, so a request crosses two
processes and, in the server, two threads. On a small CPU machine those hops are most of what
HTTP adds to a short query. Here the gateway's supervisor (`gateway.main.run`) runs one worker,
`worker`, which builds the engine on its main thread, then runs the gateway's event loop on that
same thread with the server's service stepping the engine there (`server.inline`); the gateway
calls it in process (`gateway.replicas.IN_PROCESS`), still through the wire codec's messages, so
the request core is the same. A worker that dies (an engine that cannot serve, a crash) is
started again by the supervisor, as a gateway worker is.

Measured (2-core AMD EPYC Zen 5, all-MiniLM-L6-v2, one short query, each server alone): see
docs/performance.md, "The host path, sixth round".
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import socket
from typing import Any

from embedserve.gateway.main import GatewayConfig, run, run_worker
from embedserve.gateway.replicas import IN_PROCESS, IN_PROCESS_ADDRESS
from embedserve.processes import say
from embedserve.server.main import ServerConfig


def check_one_process(servers: list[ServerConfig], gateway: GatewayConfig, replicas: int) -> None:
    """A ValueError unless `serve`'s configs (and its `--replicas`) are one model on one CPU
    server, one worker. Defaults are not the user's: `--replicas 0` (one per GPU) and the workers
    counted from the cores (`--workers 0`) are one server and one worker here."""
    models = len(gateway.entries)
    if models != 1:
        raise ValueError(
            f"--one-process serves one model from one engine; these flags ask {models} models "
            "(give one --model)"
        )
    if replicas > 1:
        raise ValueError(f"--one-process serves from one engine; --replicas {replicas} was given")
    if servers[0].engine.device not in ("cpu", "auto"):  # auto: cuda:0 where a GPU is seen
        # measured with the engine on its own thread in this process (H200): a lone query 0.3 ms
        # sooner, 64 clients 2,906 against 12,082 req/s (docs/performance.md, seventh round)
        raise ValueError(
            f"--one-process serves from the CPU; the engine would run on "
            f"{servers[0].engine.device} (give --device cpu)"
        )
    if gateway.workers > 1:  # 0: the default, one per 4 cores
        raise ValueError(f"--one-process runs one worker; --workers {gateway.workers} was given")


def run_one_process(server: ServerConfig, gateway: GatewayConfig) -> int:
    """Serve until SIGTERM / Ctrl-C (0), or until the worker keeps exiting (1)."""
    gateway = dataclasses.replace(
        gateway, replicas=(IN_PROCESS_ADDRESS,), workers=1, calls_in_flight=0
    )
    served = ", ".join(e.names[0] for e in gateway.entries)
    server = dataclasses.replace(server, engine=dataclasses.replace(server.engine, device="cpu"))
    return run(
        gateway,
        worker=functools.partial(worker, server),
        on_ready=lambda url: say(f"embedserve: serving {served} at {url} (one process)"),
    )


def worker(
    server: ServerConfig, gateway: GatewayConfig, sock: socket.socket, restarts: int
) -> None:
    """One gateway worker holding the engine (`run_one_process`): built here, before the loop,
    on the thread that then runs it."""
    from embedserve.server.main import build_here

    try:
        service, guard, budget = build_here(server)
    except ValueError as e:  # flags the model cannot honour: said once, as `server` says it
        say(f"embedserve server: error: {e}", err=True)
        raise SystemExit(2) from None
    if gateway.part_tokens is None:  # a part of a request is one batch of the engine's
        gateway = dataclasses.replace(gateway, part_tokens=budget)
    IN_PROCESS[IN_PROCESS_ADDRESS] = in_process_calls(service)

    def services(app: Any) -> list[Any]:
        service.in_process = lambda: app.in_flight  # requests read, perhaps not yet queued
        return [_Running(service, guard, server)]

    run_worker(gateway, sock, restarts, services)


def in_process_calls(service: Any) -> tuple[Any, Any]:
    """The gateway's (embed, check) calls of `service` in this process, as the gRPC and local
    transports make them: their errors and their deadline (a request still queued at it is
    dropped); always SERVING (the process serves while it runs)."""
    import grpc
    from grpc_health.v1 import health_pb2

    from embedserve.contract.local import rpc_error
    from embedserve.server.service import RequestFailed

    serving = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def embed(request: Any, timeout: float | None = None) -> Any:
        try:
            async with asyncio.timeout(timeout):
                return await service.answer(request)
        except RequestFailed as e:
            raise rpc_error(e.code, str(e)) from None
        except TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None

    async def check(request: Any, timeout: float | None = None) -> Any:
        return serving

    return embed, check


class _Running:
    """The service, its guard and its metrics as one of the worker's services: started once the
    gateway's pipelines are up, stopped after uvicorn has drained the HTTP requests."""

    def __init__(self, service: Any, guard: Any, config: ServerConfig) -> None:
        self.service, self.guard, self.config = service, guard, config

    async def start(self) -> None:
        await self.service.start()
        self.guard.start()
        if self.config.metrics_port is not None:
            from embedserve.server.metrics import start_metrics_server

            port = start_metrics_server(
                self.config.host, self.config.metrics_port, self.service.engine, self.service
            )
            say(f"embedserve server: metrics on http://{self.config.host}:{port}/metrics")

    async def stop(self) -> None:
        await self.service.stop()
        self.guard.stop()
