"""Bounded connections: uvicorn's httptools protocol with limits on what a client may hold open.

uvicorn (with httptools) accepts headers of any size and waits for them forever: one client can
pin memory with a 100 MB header, or a socket with half a request line. Here, per request:

- the request line and headers together at most `max_header_bytes` (431 and close past it,
  before the parser buffers more), at most `max_headers` header lines (431);
- the headers complete within `header_timeout` seconds of their first byte (408 and close);

and uvicorn's own `limit_concurrency` caps open connections and tasks per worker (503 past it).
The body's read timeout is the app's (`GatewayApp`, 408). uvicorn is imported by the workers only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

MESSAGES = {431: b"Request Header Fields Too Large", 408: b"Request Timeout"}


@dataclass(frozen=True)
class ConnectionLimits:
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout: float = 10.0  # s from a request's first byte to the end of its headers


def _refusal(status: int, why: str) -> bytes:
    body = (
        b'{"error": {"message": "' + why.encode() + b'", "type": "invalid_request_error", '
        b'"param": null, "code": "' + MESSAGES[status].lower().replace(b" ", b"_") + b'"}}'
    )
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n" % (status, MESSAGES[status], len(body))
    )
    return head + body


def bounded_protocol(limits: ConnectionLimits) -> type:
    """uvicorn's httptools protocol class with `limits` (see the module docstring)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        # per connection: "idle" (between requests) -> "headers" (a request's first byte came)
        # -> "request" (its headers are complete: body and answer) -> "idle"
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._phase = "idle"
            self._header_bytes = self._header_count = 0
            self._header_timer: asyncio.TimerHandle | None = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._phase == "idle" and not self.transport.is_closing():
                self._phase, self._header_bytes, self._header_count = "headers", 0, 0
                self._header_timer = asyncio.get_event_loop().call_later(
                    limits.header_timeout, self._headers_too_slow
                )
            if self._phase == "headers":
                end = data.find(b"\r\n\r\n")
                self._header_bytes += len(data) if end < 0 else end
                if self._header_bytes > limits.max_header_bytes:
                    self._refuse(
                        431, f"the request's headers are over {limits.max_header_bytes} bytes"
                    )
                    return
            super().data_received(data)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self._phase == "headers":
                timeout = f"{limits.header_timeout:g}"
                self._refuse(408, f"the request's headers did not arrive within {timeout} s")

        def _refuse(self, status: int, why: str) -> None:
            self._disarm()
            self._phase = "closed"
            if not self.transport.is_closing():
                self.transport.write(_refusal(status, why))
                self.transport.close()

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_count += 1
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            if self._header_count > limits.max_headers:
                self._refuse(431, f"the request has over {limits.max_headers} header lines")
                # stops the parser (uvicorn's data_received catches it; the answer is sent)
                raise ValueError("too many header lines")
            self._phase = "request"
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._phase == "request":
                self._phase = "idle"  # the next request's first byte arms the timer again

    return BoundedHttpToolsProtocol
