"""The server's end of the local transport (`embedserve.contract.local`): Embed calls over a
unix socket, queued by the same service as gRPC calls (`EmbedService.submit`, which `answer`
awaits for those), with the same status codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from embedserve.contract import EmbedRequest
from embedserve.contract.local import CANCEL, EMBED, Frames, frame
from embedserve.server.service import RequestFailed

log = logging.getLogger("embedserve.server")

# an EmbedRequest -> the future of its EmbedResponse (`EmbedService.submit`); a RequestFailed,
# raised or as the future's exception, is the call's status
Submit = Callable[[Any], "asyncio.Future[Any]"]


class LocalServer:
    """The listening socket and the calls in flight on it, for a drain on stop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls: set[asyncio.Future[Any]] = set()
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
    """One gateway connection: each EMBED frame submitted, its answer written from the future's
    done-callback (no task per call); a CANCEL frame cancels that future."""

    def __init__(self, local: LocalServer, submit: Submit) -> None:
        self.local, self.submit = local, submit
        self.calls: dict[int, asyncio.Future[Any]] = {}
        self.frames = Frames(self._frame)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.local.connections.add(self.transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.frames.feed(data)

    def _frame(self, call_id: int, kind: int, payload: bytes) -> None:
        if kind == CANCEL:
            if (answer := self.calls.get(call_id)) is not None:
                answer.cancel()
            return
        if kind != EMBED:
            return
        try:
            answer = self.submit(EmbedRequest.FromString(payload))
        except RequestFailed as e:
            self._write(frame(call_id, e.code.value[0], str(e).encode()))
            return
        except Exception as e:  # a malformed message, or a bug: this call fails alone
            self._failed(call_id, e)
            return
        self.calls[call_id] = answer
        self.local.calls.add(answer)
        answer.add_done_callback(functools.partial(self._answered, call_id))

    def _answered(self, call_id: int, answer: asyncio.Future[Any]) -> None:
        self.calls.pop(call_id, None)
        self.local.calls.discard(answer)
        if answer.cancelled():
            return  # the gateway cancelled it: nobody waits for an answer
        error = answer.exception()
        if error is None:
            self._write(frame(call_id, 0, answer.result().SerializeToString()))
        elif isinstance(error, RequestFailed):
            self._write(frame(call_id, error.code.value[0], str(error).encode()))
        else:
            self._failed(call_id, error)

    def _failed(self, call_id: int, error: BaseException) -> None:
        log.error("local call failed", exc_info=error)
        status = grpc.StatusCode.INTERNAL.value[0]
        self._write(frame(call_id, status, f"{type(error).__name__}: {error}".encode()))

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        # the gateway worker went away: nobody waits for its calls' answers
        for answer in list(self.calls.values()):
            answer.cancel()
        if self.transport is not None:
            self.local.connections.discard(self.transport)


async def serve_local(path: Path, submit: Submit) -> LocalServer:
    """Listen on `path` (a stale socket file of an earlier run is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    local = LocalServer(path)
    loop = asyncio.get_running_loop()
    local.server = await loop.create_unix_server(lambda: _Calls(local, submit), path=str(path))
    os.chmod(path, 0o600)  # this user's alone: the socket takes calls without any secret
    return local
