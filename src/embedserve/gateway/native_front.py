"""The gateway's ASGI app behind the native front (`serve --native`, `cli/native.py`).

Ivy (`native/src/ivy`) reads every HTTP request and answers the plain shape of the hot route
itself; it hands every other request to `PythonFront`, the app on an event loop of its own
thread, with the rules and errors the app has always had (`native/src/ivy/fallback.rs` says
how: `front(method, target, headers, reply, expired)` returns the request's `Sink`, which Ivy
feeds the body as it arrives; the app answers through `reply.send`).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any
from urllib.parse import unquote

from embedserve.gateway.replicas import DEADLINE_PASSED
from embedserve.gateway.transport import Receive, Scope


class Sink:
    """One request's body as Ivy feeds it, read by the app as ASGI messages. `feed` and `gone`
    are called from Ivy's threads; they only post to the loop, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._chunks: collections.deque[tuple[bytes, bool]] = collections.deque()
        self._arrived = asyncio.Event()  # a chunk, or the client gone
        self._gone = False
        self._ended = False  # the body's last chunk was read

    def feed(self, chunk: bytes, more: bool) -> None:
        self._loop.call_soon_threadsafe(self._put, chunk, more)

    def gone(self) -> None:
        self._loop.call_soon_threadsafe(self._leave)

    def _put(self, chunk: bytes, more: bool) -> None:
        self._chunks.append((chunk, more))
        self._arrived.set()

    def _leave(self) -> None:
        self._gone = True
        self._arrived.set()

    async def receive(self) -> dict[str, Any]:
        """The next body chunk; once the body is read, waits until the client leaves (the app
        watches for it while the request is worked on)."""
        while True:
            if self._chunks and not self._ended:
                chunk, more = self._chunks.popleft()
                self._ended = not more
                return {"type": "http.request", "body": chunk, "more_body": more}
            if self._gone:
                return {"type": "http.disconnect"}
            self._arrived.clear()
            await self._arrived.wait()


class PythonFront:
    """`front(method, target, headers, reply, expired) -> Sink`, what Ivy calls (with the GIL,
    from its threads) for a request it hands over; the app runs it on `loop`. `expired`: Ivy
    waited on its answer past `--request-timeout`, so its calls have no time left (the app
    answers it as it does a call past its deadline, without running it again)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, host: str, port: int) -> None:
        self.app: Any = None  # set before Ivy serves
        self.loop = loop
        self.server = (host, port)

    def __call__(
        self,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        reply: Any,
        expired: bool = False,
    ) -> Sink:
        sink = Sink(self.loop)
        path, _, query = target.partition("?")
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": unquote(path),
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "headers": headers,
            "server": self.server,
            "client": None,
        }
        self.loop.call_soon_threadsafe(self._start, scope, sink.receive, reply, expired)
        return sink

    def _start(self, scope: Scope, receive: Receive, reply: Any, expired: bool) -> None:
        self.loop.create_task(self._run(scope, receive, reply, expired))

    async def _run(self, scope: Scope, receive: Receive, reply: Any, expired: bool) -> None:
        status, headers, body = 500, [], []
        if expired:  # this task's own context
            DEADLINE_PASSED.set(True)

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status, headers = message["status"], list(message.get("headers", ()))
            elif message["type"] == "http.response.body":
                body.append(message.get("body", b""))

        try:
            await self.app(scope, receive, send)
        finally:  # an app that raised still answers (its 500), never leaves the client hanging
            reply.send(status, headers, b"".join(body))


class Lifespan:
    """The app's ASGI lifespan on `loop`, driven from another thread: `startup()` builds its
    pipelines and starts its services, `shutdown()` stops them (each waits; an error raises)."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.app, self.loop = app, loop
        self._asks: asyncio.Queue[dict[str, Any]] | None = None
        self._answers: asyncio.Queue[dict[str, Any]] | None = None

    def startup(self) -> None:
        self._call(self._begin())

    def shutdown(self) -> None:
        self._call(self._ask("lifespan.shutdown"))

    def _call(self, work: Any) -> None:
        asyncio.run_coroutine_threadsafe(work, self.loop).result()

    async def _begin(self) -> None:
        self._asks, self._answers = asyncio.Queue(), asyncio.Queue()
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}}
        self.loop.create_task(self.app(scope, self._asks.get, self._answers.put))
        await self._ask("lifespan.startup")

    async def _ask(self, kind: str) -> None:
        assert self._asks is not None and self._answers is not None, "startup() comes first"
        await self._asks.put({"type": kind})
        answer = await self._answers.get()
        if answer["type"].endswith(".failed"):
            raise RuntimeError(f"the gateway's {kind} failed: {answer.get('message', '')}")
