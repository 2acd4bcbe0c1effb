"""The interactive API page at `GET /docs` (and `/redoc`): one HTML file of the package, its
script and styles inline, which reads `/openapi.json` from the same server. No CDN: a server
on a machine without internet serves it whole."""

from __future__ import annotations

import functools
from importlib import resources

# the page's own script and styles only, no other origin; nothing may frame it
CONTENT_SECURITY_POLICY = (
    b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    b"connect-src 'self'; frame-ancestors 'none'"
)
HTML = b"text/html; charset=utf-8"


@functools.cache
def docs_html() -> bytes:
    return (resources.files("embedserve.gateway") / "static" / "docs.html").read_bytes()
