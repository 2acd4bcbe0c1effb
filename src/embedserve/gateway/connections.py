"""Bounded connections: uvicorn's httptools protocol with limits on what a client may hold open.

uvicorn (with httptools) accepts headers of any size and waits for them forever: one client can
pin memory with a 100 MB header, or a socket with half a request line. Here, per request:

- the request line and headers together at most `max_header_bytes` (431 and close past it,
  before the parser buffers more), at most `max_headers` header lines (431);
- the headers complete within `header_timeout` seconds of their first byte (408 and close), and
  a new connection's first request within `header_timeout` of its accept (closed without a word:
  a connection that never sends a byte must not hold its slot for ever);
- the same for a pipelined request: bytes that come after a request's body, while its answer is
  still being made, are the next request's headers and are counted as such (a request's end is
  the parser's `on_message_complete`, not its answer);

and at most `max_connections` open connections per worker, where a connection with no request
in progress (idle between requests, or its headers not complete) holds its slot only until a
new connection needs it: the oldest such is closed then. Only when every open connection has a
request in progress is a new one refused (a JSON 503, then close). So idle and slow clients
cannot lock everyone else out, and `/health` answers through a flood of idle connections.
The body's read timeout is the app's (`GatewayApp`, 408). uvicorn is imported by the workers only.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

MESSAGES = {
    431: b"Request Header Fields Too Large",
    408: b"Request Timeout",
    503: b"Service Unavailable",
}
CODES = {503: b"too_many_connections"}


@dataclass(frozen=True)
class ConnectionLimits:
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout: float = 10.0  # s from a request's first byte to the end of its headers
    max_connections: int = 1024  # open per worker (`--max-connections`)


# descriptors a worker keeps for what is not a client: its listening socket, its channels to the
# replicas, the metrics files, the event loop's own, imported libraries' files
FD_RESERVE = 128
# the soft limit asked for where the hard one is unlimited
FD_WANTED = 1 << 20


def fit_to_fd_limit(max_connections: int) -> tuple[int, str | None]:
    """The open-file limit raised to its hard limit (the workers inherit it), and the connection
    bound that fits below it with `FD_RESERVE` to spare; with a warning when the bound had to
    shrink. NOTE: past the limit `accept()` fails with EMFILE before eviction (past the bound)
    can close an idle connection, and new clients and /health are locked out: the flood eviction
    was built for, under the usual limit of 1,024."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FD_WANTED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # kept as it was: the bound below follows it
    if soft == resource.RLIM_INFINITY or max_connections <= soft - FD_RESERVE:
        return max_connections, None
    fitted = max(1, soft - FD_RESERVE)
    return fitted, (
        f"--max-connections {max_connections} is over what the open-file limit ({soft}) leaves; "
        f"each worker holds at most {fitted} (raise it with `ulimit -n`)"
    )


def _refusal(status: int, why: str) -> bytes:
    body = (
        b'{"error": {"message": "' + why.encode() + b'", "type": "invalid_request_error", '
        b'"param": null, "code": "'
        + CODES.get(status, MESSAGES[status].lower().replace(b" ", b"_"))
        + b'"}}'
    )
    retry = b"retry-after: 1\r\n" if status == 503 else b""
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"%sconnection: close\r\n\r\n" % (status, MESSAGES[status], len(body), retry)
    )
    return head + body


if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Protocol
else:
    _Protocol = object  # uvicorn is imported by the workers only (`bounded_protocol`)


class _Bounded(_Protocol):
    """The limits, mixed in before uvicorn's httptools protocol by `bounded_protocol`."""

    limits: ConnectionLimits

    # per connection: "idle" (between requests) -> "headers" (a request's first byte came)
    # -> "body" (its headers are complete) -> "idle" (its body is complete: whatever comes
    # next is the next request, even while this one's answer is still being made)
    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._phase = "idle"
        self._header_bytes = self._header_count = 0
        self._tail = b""  # the last bytes of the headers read so far
        self._header_timer: asyncio.TimerHandle | None = None
        self._refusal: bytes | None = None  # to send once the answer in progress is out
        self._since = time.monotonic()  # when it last became idle (eviction order)
        # NOTE: timed from the accept, not the first byte: a client that connects and sends
        # nothing would hold its slot for ever (1,030 of them locked every client out)
        self._header_timer = asyncio.get_event_loop().call_later(
            self.limits.header_timeout, self._silent_too_long
        )
        if len(self.connections) > self.limits.max_connections and not _evict(self):
            self._refuse(503, f"the gateway worker has {self.limits.max_connections} requests open")

    def _evictable(self) -> bool:
        """No request in progress: idle between requests, or its headers not complete."""
        return (
            self._phase in ("idle", "headers")
            and not self._answering()
            and not self.pipeline
            and not self.transport.is_closing()
        )

    def _silent_too_long(self) -> None:
        self._header_timer = None
        if self._phase == "idle" and not self._answering() and not self.transport.is_closing():
            self._phase = "closed"
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase == "closed":
            return  # refused: the rest is not read into memory
        if self._phase == "idle" and not self.transport.is_closing():
            self._disarm()  # the accept's timer: this request's own starts now
            self._phase, self._header_bytes, self._header_count = "headers", 0, 0
            self._tail = b""
            self._header_timer = asyncio.get_event_loop().call_later(
                self.limits.header_timeout, self._headers_too_slow
            )
        if self._phase == "headers":
            # NOTE: the blank line may be split across two reads: look for it from the last
            # bytes of the one before, or the body after it is counted as header bytes (431)
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            self._header_bytes += len(data) if end < 0 else max(end - len(self._tail), 0)
            self._tail = seen[-3:]
            if self._header_bytes > self.limits.max_header_bytes:
                self._refuse(
                    431, f"the request's headers are over {self.limits.max_header_bytes} bytes"
                )
                return
        super().data_received(data)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _answering(self) -> bool:
        cycle = getattr(self, "cycle", None)
        return cycle is not None and not cycle.response_complete

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._phase != "headers":
            return
        if self._answering():
            # a pipelined request's headers may wait for the answer before them
            self._header_timer = asyncio.get_event_loop().call_later(
                self.limits.header_timeout, self._headers_too_slow
            )
            return
        timeout = f"{self.limits.header_timeout:g}"
        self._refuse(408, f"the request's headers did not arrive within {timeout} s")

    def _refuse(self, status: int, why: str) -> None:
        self._disarm()
        self._phase = "closed"  # nothing more reaches the parser
        if self.transport.is_closing():
            return
        if self._answering():
            # NOTE: a refusal written now would land inside the earlier request's answer:
            # reading stops, and the refusal follows that answer
            self._refusal = _refusal(status, why)
            self.flow.pause_reading()
            return
        self.transport.write(_refusal(status, why))
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refusal is not None and not self.transport.is_closing():
            self.transport.write(self._refusal)
            self.transport.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        if self._header_count > self.limits.max_headers:
            self._refuse(431, f"the request has over {self.limits.max_headers} header lines")
            # stops the parser (uvicorn's data_received catches it; the answer is sent)
            raise ValueError("too many header lines")
        if len(self.tasks) >= self.limits.max_connections:
            self._refuse(503, f"the gateway worker has {self.limits.max_connections} requests open")
            raise ValueError("too many requests")
        self._phase = "body"
        super().on_headers_complete()
        # NOTE: `self.cycle` is the request's (uvicorn makes it above), unless the parser stopped
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not isinstance(cycle.transport, _OneWrite):
            cycle.transport = _OneWrite(cycle.transport)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._phase == "body":
            self._phase = "idle"  # the next request's first byte arms the timer again
            self._since = time.monotonic()


class _OneWrite:
    """A response's transport as uvicorn's cycle sees it: the status line and headers are held
    and leave with the body, in one write. uvicorn writes them apart, and on loopback each
    write is a send that wakes the client; the second wake-up is a context switch per request
    for nothing. A held write that nothing follows (HEAD, a streamed body's first part still
    to come) leaves at the end of the loop's turn."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
            self._transport.write(data)
        elif data.startswith(b"HTTP/"):
            self._held = data
            asyncio.get_event_loop().call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        if self._held is not None:
            data, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _evict(newcomer: _Bounded) -> bool:
    """Close the connection idle the longest (see the module docstring) to make room for
    `newcomer`; False when every other open connection has a request in progress."""
    others: list[_Bounded] = [c for c in newcomer.connections if isinstance(c, _Bounded)]
    idle = [c for c in others if c is not newcomer and c._evictable()]
    if not idle:
        return False
    oldest = min(idle, key=lambda c: (c._phase != "idle", c._since))
    oldest._disarm()
    oldest._phase = "closed"
    oldest.transport.close()
    # NOTE: uvicorn drops a closed connection from its set on the next loop turn: drop it now,
    # so the newcomer's request is not refused for a slot already given back
    newcomer.connections.discard(oldest)
    return True


def bounded_protocol(limits: ConnectionLimits) -> type:
    """uvicorn's httptools protocol class with `limits` (see the module docstring)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return type("BoundedHttpToolsProtocol", (_Bounded, HttpToolsProtocol), {"limits": limits})
