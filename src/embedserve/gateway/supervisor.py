"""The gateway's first process: it holds the port, runs the workers (`gateway.workers`) and
turns SIGTERM / Ctrl-C into a drain of every worker."""

from __future__ import annotations

import dataclasses
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

from embedserve.gateway.sockets import bind, reserve_port, wait_until_up
from embedserve.gateway.workers import Stop, Workers
from embedserve.processes import say, write_ready


def supervise(
    config: Any,
    worker: Callable[[Any, socket.socket, int], None],
    listening: str,
) -> int:
    """Serve `config` (a `GatewayConfig`) from its workers (`worker`) until a signal; say
    "listening on URL (`listening`)" once they answer."""
    sock = bind(config.host, config.port)
    port = sock.getsockname()[1]
    grpc_sock = reserve_port(config.host, config.tei_grpc_port)  # the workers' one port
    if grpc_sock is not None:
        config = dataclasses.replace(config, tei_grpc_port=grpc_sock.getsockname()[1])
    workers = Workers(config, sock, worker)
    # the workers drain for --drain-seconds, and kill themselves 10 s after it (`run_worker`)
    stop = Stop(workers, config.drain_seconds + 10)
    signal.signal(signal.SIGTERM, stop.ask)
    signal.signal(signal.SIGINT, stop.ask)
    signal.signal(signal.SIGHUP, lambda signum, frame: workers.signal(signal.SIGHUP))
    host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"http://{host}:{port}"
    try:
        wait_until_up(f"{url}/health", workers.processes, lambda: stop.asked > 0)
    except RuntimeError as e:
        if not stop.asked:  # a second ask would kill at once: the stop asked already drains
            stop.ask(signal.SIGTERM, None)
        stop.carry_out()
        workers.join(10)
        say(f"embedserve gateway: error: {e}", err=True)
        return 1
    grpc_address = {}
    if grpc_sock is not None:
        grpc_sock.close()
        grpc_address["tei_grpc"] = f"{host}:{config.tei_grpc_port}"
    say(
        f"embedserve gateway: listening on {url} ({listening})"
        + "".join(f"; TEI gRPC API on {a}" for a in grpc_address.values()),
    )
    write_ready({"url": url, "workers": config.workers, **grpc_address})
    # NOTE: `keep` before `alive`: the one worker of `--workers 1` found dead must be given its
    # restart (which `alive` then counts), not taken for the end of the gateway
    while True:
        stopping = stop.carry_out()
        if not stopping and not workers.keep():
            say("embedserve gateway: a worker keeps exiting; stopping", err=True)
            stop.ask(signal.SIGTERM, None)
            continue
        if not workers.alive():
            break
        time.sleep(0.2)
    # NOTE: our copy of the socket is kept while workers may be restarted; once they have all
    # gone it must go too (connections would pile up unanswered on an open port)
    sock.close()
    say("embedserve gateway: stopped")
    return 0 if workers.exited_cleanly() else 1
