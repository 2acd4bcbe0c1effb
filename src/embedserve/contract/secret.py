"""A shared secret on the gateway -> server gRPC link, for servers bound wider than loopback.

Both sides read the same file (`--link-secret-file`). The gateway sends it as call metadata on
every Embed call; the server refuses a call without it (UNAUTHENTICATED), comparing in constant
time. Health checks stay open (a readiness probe cannot send metadata; health says only
SERVING or not). The unix socket of a same-host server is the user's alone (mode 0600).
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

import grpc

LINK_SECRET_KEY = "x-embedserve-link-secret"
OPEN_METHODS = "/grpc.health.v1.Health/"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def read_secret(path: str) -> str:
    try:
        secret = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ValueError(f"--link-secret-file {path}: cannot read it ({e.strerror})") from None
    if len(secret) < 16:
        raise ValueError(f"--link-secret-file {path}: the secret must be at least 16 characters")
    return secret


def call_metadata(secret: str | None) -> tuple[tuple[str, str], ...]:
    """What the gateway sends with each Embed call."""
    return ((LINK_SECRET_KEY, secret),) if secret else ()


class LinkSecretInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call but health checks that does not carry the secret."""

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "this server needs the link secret"
            )

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        if details.method.startswith(OPEN_METHODS):
            return await continuation(details)
        sent = ""
        for key, value in details.invocation_metadata or ():
            if key == LINK_SECRET_KEY:
                sent = value
        if hmac.compare_digest(sent.encode(), self._secret):
            return await continuation(details)
        return self._deny
