"""The same Embed call over a unix socket, for a gateway and a server on one host.

A grpc.aio unary round trip costs about 1.1 ms on the H200 host against a no-op server
(`concurrency-h200-breakdown-20261201`), more than the engine's step: a local replica is reached
through this lean framing instead, with the same messages and the same status codes, and gRPC
stays for remote replicas and health checks. The server listens on `socket_path(port)` beside
its gRPC port; the gateway uses that socket when it exists for a replica on this host.

NOTE: the socket takes calls without the link secret, so it lives in this user's own directory
(`socket_dir`: 0700, owned by us, not a link): another user can neither reach it nor put a socket
of their own at its name (a stale one in the shared temporary directory, which we could not
remove, stopped the server from starting).

Frames, both ways: a header `<IIB` (payload bytes, call id, kind) and the payload.
- gateway -> server: kind `EMBED` with a serialized EmbedRequest, or `CANCEL` (no payload):
  the client went away or its deadline passed, so the server drops the call.
- server -> gateway: kind = the call's `grpc.StatusCode` number (0: OK, with a serialized
  EmbedResponse; otherwise the error's details, UTF-8).
Calls are multiplexed on one connection per gateway worker and replica; answers come in any order.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import stat
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from embedserve.contract import EmbedRequest, EmbedResponse

HEADER = struct.Struct("<IIB")  # payload bytes, call id, kind (or status code on answers)
EMBED, CANCEL = 0, 1
STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def _ours(info: os.stat_result) -> bool:
    return info.st_uid == os.getuid()


def socket_dir() -> Path | None:
    """This user's directory for local sockets, `<tmp>/embedserve-<uid>`, made 0700 if missing;
    None when that name is something we cannot trust (another user's, a link, open to others)."""
    path = Path(tempfile.gettempdir()) / f"embedserve-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    private = stat.S_ISDIR(info.st_mode) and not stat.S_IMODE(info.st_mode) & 0o077
    return path if private and _ours(info) else None


def socket_path(port: int) -> Path | None:
    """Where the server on `port` of this host listens for local calls (None: see `socket_dir`)."""
    folder = socket_dir()
    return None if folder is None else folder / f"{port}.sock"


def local_socket_for(address: str) -> Path | None:
    """The unix socket of a replica at HOST:PORT, when it is on this host, listening, ours."""
    host, _, port = address.rpartition(":")
    if host not in LOCAL_HOSTS or not port.isdigit():
        return None
    path = socket_path(int(port))
    try:
        info = None if path is None else os.lstat(path)
    except OSError:
        return None
    return path if info is not None and _ours(info) else None


def frame(call_id: int, kind: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), call_id, kind) + payload


class Frames:
    """Frames cut out of a byte stream as it arrives, each handed to `on_frame(call id, kind,
    payload)`: both ends' parser, fed from an `asyncio.Protocol`'s `data_received`.

    NOTE: a protocol, not asyncio's streams: with a stream every frame wakes a reading task (two
    `readexactly` awaits) which then wakes the caller; here the loop's read callback answers the
    caller itself, one task step fewer per call on each end."""

    def __init__(self, on_frame: Callable[[int, int, bytes], None]) -> None:
        self.on_frame = on_frame
        self._buffer = bytearray()  # the start of a frame not yet complete
        self._needed = HEADER.size  # bytes the buffer must hold before it is looked at again

    def feed(self, data: bytes) -> None:
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) < self._needed:  # a large frame in many reads: no copy until whole
                return
            data = bytes(buffer)
        start, size = 0, len(data)
        needed = HEADER.size
        while size - start >= HEADER.size:
            length, call_id, kind = HEADER.unpack_from(data, start)
            end = start + HEADER.size + length
            if end > size:
                needed = end - start
                break
            self.on_frame(call_id, kind, data[start + HEADER.size : end])
            start = end
        buffer[:] = data[start:]
        self._needed = needed


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a gRPC call would raise, so the replica pool treats both transports alike."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class _Expired(Exception):
    """A call's deadline passed (set on its future by the loop's timer)."""


def _expire(answer: asyncio.Future[tuple[int, bytes]]) -> None:
    if not answer.done():
        answer.set_exception(_Expired())


class _Answers(asyncio.Protocol):
    """One connection and its calls in flight, each answered as its frame arrives."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self.frames = Frames(self._answer)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.frames.feed(data)

    def _answer(self, call_id: int, status: int, payload: bytes) -> None:
        answer = self.calls.get(call_id)
        if answer is not None and not answer.done():
            answer.set_result((status, payload))

    def connection_lost(self, exc: Exception | None) -> None:
        # the server went away: fail what is outstanding; the next call reconnects
        lost = rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.path}: connection closed")
        for answer in self.calls.values():
            if not answer.done():
                answer.set_exception(lost)

    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()


class LocalEmbedClient:
    """`await client(request, timeout=...)` like the gRPC stub, over the replica's socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ids = itertools.count(1)
        self._connection: _Answers | None = None
        self._connecting = asyncio.Lock()

    async def __call__(self, request: Any, timeout: float | None = None) -> Any:
        conn = self._connection
        if conn is None or not conn.usable():
            conn = await self._connect()
        transport, calls = conn.transport, conn.calls
        assert transport is not None
        call_id = next(self._ids)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        calls[call_id] = answer
        timer = None if timeout is None else loop.call_later(timeout, _expire, answer)
        try:
            transport.write(frame(call_id, EMBED, request.SerializeToString()))
            status, payload = await answer
        except _Expired:
            _cancel(transport, call_id)
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except asyncio.CancelledError:
            _cancel(transport, call_id)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            calls.pop(call_id, None)
        if status:
            raise rpc_error(STATUS_BY_NUMBER[status], payload.decode(errors="replace"))
        return EmbedResponse.FromString(payload)

    async def _connect(self) -> _Answers:
        async with self._connecting:
            if self._connection is None or not self._connection.usable():
                loop = asyncio.get_running_loop()
                try:
                    _, conn = await loop.create_unix_connection(
                        lambda: _Answers(self.path), str(self.path)
                    )
                except OSError as e:
                    raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.path}: {e}") from None
                self._connection = conn
            return self._connection

    async def close(self) -> None:
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.close()
            await asyncio.sleep(0)  # its connection_lost runs


def _cancel(transport: asyncio.Transport, call_id: int) -> None:
    """Tell the server the caller went away or its deadline passed: it drops the call."""
    if not transport.is_closing():
        transport.write(frame(call_id, CANCEL))


__all__ = ["EmbedRequest", "Frames", "LocalEmbedClient", "local_socket_for", "socket_path"]
