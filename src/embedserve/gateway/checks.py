"""What a request must pass before its handler runs: its Host, its API key, its Content-Type and
its route; and the request id it is answered with.

Each check raises the `ApiError` the client gets; none reads the body.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Iterable

from embedserve.gateway.errors import ApiError

REQUEST_ID_MAX = 128  # longer (or unprintable) X-Request-Id values are replaced by our own


def check_headers(raw: list[tuple[bytes, bytes]], headers: dict[bytes, bytes]) -> None:
    """Headers no request may carry: two `Host` (the standard says 400; the last one won, and
    could pass `--allowed-host` for the first), or a `Content-Encoding` (a compressed body read
    as JSON was a confusing UTF-8 400)."""
    if len(headers) < len(raw) and sum(1 for name, _ in raw if name == b"host") > 1:
        raise ApiError(400, "the request has more than one Host header", code="duplicate_host")
    encoding = headers.get(b"content-encoding", b"identity").strip().lower()
    if encoding != b"identity":
        raise ApiError(
            415,
            f"Content-Encoding {encoding.decode('latin-1')!r} is not supported; send the body "
            "uncompressed",
            param="Content-Encoding",
            code="unsupported_media_type",
        )


def check_host(headers: dict[bytes, bytes], allowed_hosts: frozenset[str]) -> None:
    """A page on another site cannot reach a local server through DNS rebinding: its
    requests carry that site's Host."""
    host = headers.get(b"host", b"").decode("latin-1").strip().lower()
    host = host[1 : host.index("]")] if host.startswith("[") and "]" in host else host
    host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if host not in allowed_hosts:
        raise ApiError(
            421,
            "the Host of this request is not one this server answers to (see --allowed-host)",
            code="host_not_allowed",
        )


def authenticate(headers: dict[bytes, bytes], keys: frozenset[bytes]) -> bytes:
    """`Authorization: Bearer <key>` with one of `keys`; no keys: anyone. The key it matched
    (b"": no keys), whose digest is the request's tenant (`gateway.result_cache`)."""
    if not keys:
        return b""
    scheme, _, sent = headers.get(b"authorization", b"").partition(b" ")
    if scheme.lower() != b"bearer":
        sent = b""
    # NOTE: compare_digest against every key, always: the time to reject a key depends
    # neither on how much of it matches nor on which key it was close to
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(sent.strip(), key)
    if not matched:
        raise ApiError(
            401,
            "a valid API key is required: send Authorization: Bearer <key>"
            if not sent
            else "the API key is not valid",
            code="invalid_api_key",
            headers=((b"www-authenticate", b"Bearer"),),
        )
    return sent.strip()  # equal to the key it matched


def check_content_type(headers: dict[bytes, bytes]) -> None:
    """A JSON body says so: `application/json` (parameters such as `charset` allowed) or a
    `+json` type. NOTE: none at all is refused too: a cross-site page can POST without a
    preflight only a form, `text/plain` or a body of no type (`fetch` of a Blob), and each of
    them reaching a keyless local gateway would make it work for that page."""
    value = headers.get(b"content-type")
    media = b"" if value is None else value.split(b";", 1)[0].strip().lower()
    if media != b"application/json" and not media.endswith(b"+json"):
        sent = "no Content-Type" if value is None else f"Content-Type {value.decode('latin-1')!r}"
        raise ApiError(
            415,
            f"the request has {sent}; send the header Content-Type: application/json",
            param="Content-Type",
            code="unsupported_media_type",
        )


def no_route(method: str, path: str, routes: Iterable[tuple[str, str]]) -> ApiError:
    """405 with the methods allowed on a known path, else 404."""
    allowed = ", ".join(m for m, p in routes if p == path)
    if allowed:
        return ApiError(
            405,
            f"{method} is not allowed on {path}; use {allowed}",
            code="method_not_allowed",
            headers=((b"allow", allowed.encode()),),
        )
    return ApiError(404, f"no route {method} {path}", code="not_found")


def request_id(headers: dict[bytes, bytes]) -> bytes:
    """The client's X-Request-Id when it is short and printable, else a new one."""
    value = headers.get(b"x-request-id", b"")
    if 0 < len(value) <= REQUEST_ID_MAX and all(33 <= c < 127 for c in value):
        return bytes(value)
    return uuid.uuid4().hex.encode()
