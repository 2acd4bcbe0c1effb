"""The server's end of the local transport (`embedserve.contract.local`): Embed calls over a
unix socket, answered by the same `EmbedService.answer` as gRPC calls, with the same status codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from embedserve.contract import EmbedRequest
from embedserve.contract.local import CANCEL, EMBED, Frames, frame
from embedserve.server.service import RequestFailed

log = logging.getLogger("embedserve.server")

Answer = Callable[[Any], Awaitable[Any]]


class LocalServer:
    """The listening socket and the calls in flight on it, for a drain on stop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls: set[asyncio.Task[None]] = set()
        self.connections: set[asyncio.Transport] = set()
        self.server: asyncio.AbstractServer | None = None

    async def stop(self, grace: float) -> None:
        """No new connections; calls in flight get `grace` seconds to finish, then the
        connections close (the gateway answers what is left as unavailable)."""
        if self.server is not None:
            self.server.close()
        if self.calls:
            await asyncio.wait(set(self.calls), timeout=grace)
        for transport in list(self.connections):
            transport.close()
        self.path.unlink(missing_ok=True)


class _Calls(asyncio.Protocol):
    """One gateway connection: each EMBED frame a task answering it, a CANCEL frame its end."""

    def __init__(self, local: LocalServer, answer: Answer) -> None:
        self.local, self.answer = local, answer
        self.calls: dict[int, asyncio.Task[None]] = {}
        self.frames = Frames(self._frame)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.local.connections.add(self.transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.frames.feed(data)

    def _frame(self, call_id: int, kind: int, payload: bytes) -> None:
        if kind == EMBED:
            task = asyncio.get_running_loop().create_task(self._call(call_id, payload))
            self.calls[call_id] = task
            self.local.calls.add(task)
            task.add_done_callback(self.local.calls.discard)
        elif kind == CANCEL and call_id in self.calls:
            self.calls[call_id].cancel()

    async def _call(self, call_id: int, payload: bytes) -> None:
        try:
            response = await self.answer(EmbedRequest.FromString(payload))
        except RequestFailed as e:
            self._write(frame(call_id, e.code.value[0], str(e).encode()))
        except asyncio.CancelledError:
            return  # the gateway cancelled it: nobody waits for an answer
        except Exception as e:  # a malformed message, or a bug: this call fails alone
            log.exception("local call failed")
            status = grpc.StatusCode.INTERNAL.value[0]
            self._write(frame(call_id, status, f"{type(e).__name__}: {e}".encode()))
        else:
            self._write(frame(call_id, 0, response.SerializeToString()))
        finally:
            self.calls.pop(call_id, None)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        # the gateway worker went away: nobody waits for its calls' answers
        for task in self.calls.values():
            task.cancel()
        if self.transport is not None:
            self.local.connections.discard(self.transport)


async def serve_local(path: Path, answer: Answer) -> LocalServer:
    """Listen on `path` (a stale socket file of an earlier run is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    local = LocalServer(path)
    loop = asyncio.get_running_loop()
    local.server = await loop.create_unix_server(lambda: _Calls(local, answer), path=str(path))
    os.chmod(path, 0o600)  # this user's alone: the socket takes calls without any secret
    return local
