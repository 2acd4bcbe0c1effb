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


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    """(call id, kind, payload); IncompleteReadError when the other side closed."""
    size, call_id, kind = HEADER.unpack(await reader.readexactly(HEADER.size))
    return call_id, kind, await reader.readexactly(size) if size else b""


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a gRPC call would raise, so the replica pool treats both transports alike."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class LocalEmbedClient:
    """`await client(request, timeout=...)` like the gRPC stub, over the replica's socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()

    async def __call__(self, request: Any, timeout: float | None = None) -> Any:
        writer = await self._connection()
        call_id = next(self._ids)
        answer: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = answer
        try:
            writer.write(frame(call_id, EMBED, request.SerializeToString()))
            status, payload = await asyncio.wait_for(answer, timeout)
        except (TimeoutError, asyncio.CancelledError) as e:
            self._cancel(call_id)
            if isinstance(e, TimeoutError):
                raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            raise
        finally:
            self._calls.pop(call_id, None)
        if status:
            raise rpc_error(STATUS_BY_NUMBER[status], payload.decode(errors="replace"))
        return EmbedResponse.FromString(payload)

    def _cancel(self, call_id: int) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(frame(call_id, CANCEL))

    async def _connection(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is None or self._writer.is_closing():
                try:
                    reader, self._writer = await asyncio.open_unix_connection(str(self.path))
                except OSError as e:
                    raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.path}: {e}") from None
                self._reading = asyncio.create_task(self._read(reader), name="local-replica")
            return self._writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                call_id, status, payload = await read_frame(reader)
                answer = self._calls.get(call_id)
                if answer is not None and not answer.done():
                    answer.set_result((status, payload))
        except (asyncio.IncompleteReadError, OSError):
            pass  # the server went away: fail what is outstanding; the next call reconnects
        finally:
            if self._writer is not None:
                self._writer.close()
            lost = rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.path}: connection closed")
            for answer in self._calls.values():
                if not answer.done():
                    answer.set_exception(lost)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading


__all__ = ["EmbedRequest", "LocalEmbedClient", "local_socket_for", "socket_path"]
