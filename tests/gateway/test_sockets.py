"""The supervisor's sockets: a TEI gRPC port another process holds is refused, not shared."""

from __future__ import annotations

import socket

import pytest

from embedserve.gateway.sockets import reserve_port


def _holder(reuseport: bool) -> socket.socket:
    """A listener on a free loopback port, as another server's grpc workers hold theirs."""
    sock = socket.socket()
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize("reuseport", [True, False])
def test_a_held_grpc_port_is_refused(reuseport: bool) -> None:
    # with SO_REUSEPORT on both sides the kernel would split clients between two models
    held = _holder(reuseport)
    port = held.getsockname()[1]
    try:
        with pytest.raises(ValueError, match=rf"127.0.0.1:{port}.*another server holds it"):
            reserve_port("127.0.0.1", port)
    finally:
        held.close()


def test_a_free_port_is_reserved_for_the_workers() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    sock = reserve_port("127.0.0.1", port)
    assert sock is not None and sock.getsockname()[1] == port
    try:
        # the workers bind it again beside the reservation, as grpc does with so_reuseport
        worker = socket.socket()
        worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        worker.bind(("127.0.0.1", port))
        worker.listen()
        worker.close()
    finally:
        sock.close()
    assert reserve_port("127.0.0.1", None) is None
