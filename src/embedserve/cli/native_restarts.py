"""`serve --native`'s launcher: the one native process (`cli/native.py`: Ivy, Tulip and the
engine) runs as a child of this one, which starts it again when its engine can no longer serve,
as `serve` starts a server process again.

The native process ends with FATAL_EXIT_CODE when its engine guard trips (`--max-failed-steps`
failures in a row, an error the device cannot recover from, a step past `--step-timeout`): a
sticky CUDA error leaves a process nothing else to do. Started again, on the port it listened on
(and TEI's gRPC port), it builds a new engine in a new process. Nothing of a request passes
through here: the child listens on the port itself, and this process only waits, relays the
child's output and forwards SIGTERM / Ctrl-C (a drain) and SIGHUP (the API key file).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any

from embedserve.cli.native import run_native
from embedserve.gateway.main import GatewayConfig
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
from embedserve.server.main import FATAL_EXIT_CODE, ServerConfig

# set for the child: it serves (`cli.launch.run_serve`) instead of starting one of its own
NATIVE_CHILD_ENV = "EMBEDSERVE_NATIVE_CHILD"


def serve_native(given: list[str], servers: list[ServerConfig], gateway: GatewayConfig) -> int:
    """`serve` in one process (`cli.launch.serve_mode`), the words `given`: served here
    when this is the child, else by a child this process starts and watches."""
    if os.environ.get(NATIVE_CHILD_ENV):
        exit_with_parent(gateway.drain_seconds + ORPHAN_GRACE_SECONDS)  # a launcher killed
        return run_native(servers, gateway)
    return supervise_native(given, gateway.drain_seconds)


def supervise_native(given: list[str], drain_seconds: float) -> int:
    """Runs `embedserve GIVEN...` (`serve --native ...`) as the native process until SIGTERM /
    Ctrl-C (then its exit status, 0 once drained), starting it again on the same ports each time
    it exits with FATAL_EXIT_CODE, at most `Restarts`' times a minute (then 1). Any other exit
    ends this one with its status (a folder that cannot be served: its error, said by it)."""
    stop = threading.Event()
    argv = [sys.executable, "-m", "embedserve.cli.main", *given]
    running: list[Child] = []

    def forward_reload(signum: int, frame: Any) -> None:  # the API key file read again
        if running:
            running[-1].signal(signal.SIGHUP)

    first = set_on_signal(stop)

    def asked(signum: int, frame: Any) -> None:
        # a second ask goes to the native process as it comes: there, one more than
        # AGAIN_AFTER_S after the first stops it at once (a drain not waited out)
        if stop.is_set() and running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(running[-1].proc.pid, signal.SIGTERM)  # no lock taken in a handler
        first(signum, frame)

    signal.signal(signal.SIGTERM, asked)
    signal.signal(signal.SIGINT, asked)
    signal.signal(signal.SIGHUP, forward_reload)
    restarts = Restarts()
    try:
        record = _started(argv, running, stop)
        if isinstance(record, int):
            return record
        write_ready(record)  # for whoever started this process (`processes.write_ready`)
        argv += _same_ports(record)
        while not stop.wait(0.2):
            code = running[-1].proc.poll()
            if code is None:
                continue
            if code != FATAL_EXIT_CODE:
                return code
            if not restarts.allow():
                say("embedserve: the native process keeps exiting; shutting down", err=True)
                return 1
            say("embedserve: the engine could not serve; starting the native process again")
            again = _started(argv, running, stop)
            if isinstance(again, int):
                return again
        return running[-1].stop(drain_seconds + 10)
    finally:
        if running:
            running[-1].stop(drain_seconds + 10)


def _started(argv: list[str], running: list[Child], stop: threading.Event) -> dict[str, Any] | int:
    """The native process started (appended to `running`) and its ready record; or the status to
    exit with: its own when it exited first, 1 when it was not ready in time, 0 when asked to
    stop meanwhile."""
    child = Child(argv, name="native", relay=sys.stderr, env={NATIVE_CHILD_ENV: "1"})
    running.append(child)
    try:
        record = child.wait_ready(START_TIMEOUT_S, cancel=stop)
    except RuntimeError:  # it exited first, its error said
        return child.proc.wait()
    except TimeoutError as e:
        say(f"embedserve serve: error: {e}", err=True)
        return 1
    except KeyboardInterrupt:
        return 0
    child.forget_output()
    return record


def _same_ports(record: dict[str, Any]) -> list[str]:
    """The flags that start the process again on the ports it took (`--port 0` included)."""
    flags = ["--port", str(record["url"]).rsplit(":", 1)[1]]
    if record.get("tei_grpc"):
        flags += ["--tei-grpc-port", str(record["tei_grpc"]).rsplit(":", 1)[1]]
    if record.get("metrics_port"):
        flags += ["--metrics-port", str(record["metrics_port"])]
    return flags
