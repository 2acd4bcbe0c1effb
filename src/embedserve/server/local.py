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
from embedserve.contract.local import CANCEL, EMBED, frame, read_frame
from embedserve.server.service import RequestFailed

log = logging.getLogger("embedserve.server")

Answer = Callable[[Any], Awaitable[Any]]


class LocalServer:
    """The listening socket and the calls in flight on it, for a drain on stop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls: set[asyncio.Task[None]] = set()
        self.connections: set[asyncio.StreamWriter] = set()
        self.server: asyncio.AbstractServer | None = None

    async def stop(self, grace: float) -> None:
        """No new connections; calls in flight get `grace` seconds to finish, then the
        connections close (the gateway answers what is left as unavailable)."""
        if self.server is not None:
            self.server.close()
        if self.calls:
            await asyncio.wait(set(self.calls), timeout=grace)
        for writer in self.connections:
            writer.close()
        self.path.unlink(missing_ok=True)


async def serve_local(path: Path, answer: Answer) -> LocalServer:
    """Listen on `path` (a stale socket file of an earlier run is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    local = LocalServer(path)

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        calls: dict[int, asyncio.Task[None]] = {}
        local.connections.add(writer)

        async def call(call_id: int, payload: bytes) -> None:
            try:
                response = await answer(EmbedRequest.FromString(payload))
            except RequestFailed as e:
                writer.write(frame(call_id, e.code.value[0], str(e).encode()))
            except asyncio.CancelledError:
                return  # the gateway cancelled it: nobody waits for an answer
            except Exception as e:  # a malformed message, or a bug: this call fails alone
                log.exception("local call failed")
                status = grpc.StatusCode.INTERNAL.value[0]
                writer.write(frame(call_id, status, f"{type(e).__name__}: {e}".encode()))
            else:
                writer.write(frame(call_id, 0, response.SerializeToString()))
            finally:
                calls.pop(call_id, None)

        try:
            while True:
                call_id, kind, payload = await read_frame(reader)
                if kind == EMBED:
                    task = asyncio.create_task(call(call_id, payload))
                    calls[call_id] = task
                    local.calls.add(task)
                    task.add_done_callback(local.calls.discard)
                elif kind == CANCEL and call_id in calls:
                    calls[call_id].cancel()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the gateway worker went away
        finally:
            for task in calls.values():
                task.cancel()
            local.connections.discard(writer)
            writer.close()

    local.server = await asyncio.start_unix_server(connection, path=str(path))
    os.chmod(path, 0o600)  # this user's alone: the socket takes calls without any secret
    return local
