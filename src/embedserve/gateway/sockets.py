"""The sockets the gateway's supervisor binds before its workers start: the HTTP port (`bind`),
which the workers inherit, and the TEI gRPC port's reservation (`reserve_port`), which they bind
again themselves (grpc cannot take a socket it did not make); then the wait for the workers to
answer on it (`wait_until_up`).
"""

from __future__ import annotations

import errno
import multiprocessing.process
import socket
import time
import urllib.request
from collections.abc import Callable, Sequence

from embedserve.processes import START_TIMEOUT_S


def bind(host: str, port: int) -> socket.socket:
    """The listening socket; a clear ValueError (one line: what, where, what to do) when the
    address cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ValueError(
                f"port {port} on {host} is already in use (another server?): stop it, or pick "
                "another with --port (--port 0: any free port)"
            ) from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise ValueError(
                f"{host} is not an address of this machine: use --host 127.0.0.1 (this machine "
                "only) or 0.0.0.0 (every interface)"
            ) from None
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def reserve_port(host: str, port: int | None) -> socket.socket | None:
    """A socket bound to the gRPC port (0: a free one) and not listening, held by the
    supervisor until its workers listen there (SO_REUSEPORT, as they bind it): port 0 becomes
    one real port for all of them, and a port in use fails in the launcher with a clear error."""
    if port is None:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if port != 0:
        # NOTE: SO_REUSEPORT lets any process of this user bind the port beside a holder that set
        # it too (grpc's servers do), and the kernel then splits clients between the two: another
        # model's vectors answered with status OK. A bind without it fails where anyone holds it.
        probe = socket.socket(family)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise _grpc_port_error(host, port, e) from None
        finally:
            probe.close()
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise _grpc_port_error(host, port, e) from None
    return sock


def _grpc_port_error(host: str, port: int, e: OSError) -> ValueError:
    held = " (another server holds it)" if e.errno == errno.EADDRINUSE else ""
    return ValueError(
        f"cannot listen for TEI's gRPC API on {host}:{port}: {e.strerror}{held}; pick another "
        "with --tei-grpc-port (0: any free port)"
    )


def wait_until_up(
    url: str,
    processes: Sequence[multiprocessing.process.BaseProcess],
    stopped: Callable[[], bool] = lambda: False,
) -> None:
    """Until `url` answers 200 (the workers are up); a RuntimeError if a worker dies first, a
    stop is asked (`stopped`) or after `START_TIMEOUT_S`."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if stopped():
            raise RuntimeError("stopped before the workers were up")
        if not all(p.is_alive() for p in processes):
            raise RuntimeError("a gateway worker exited during startup")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the gateway did not come up at {url}")
