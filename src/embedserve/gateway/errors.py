"""API errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}` + a status.

| status | type                  | when                                                          |
|--------|-----------------------|---------------------------------------------------------------|
| 400    | invalid_request_error | malformed JSON, wrong types, empty input, too long, bad option |
| 401    | authentication_error  | `--api-key` set and no or a wrong `Authorization: Bearer` key |
| 404    | not_found_error       | unknown model or route                                        |
| 405    | invalid_request_error | a known route with the wrong method (`Allow` lists the right) |
| 408    | invalid_request_error | a body slower than `--body-timeout` (headers: `--header-timeout`) |
| 413    | invalid_request_error | body over `--max-body-bytes`                                  |
| 415    | invalid_request_error | a POST body whose `Content-Type` is not JSON                  |
| 421    | invalid_request_error | a `Host` outside `--allowed-host` (default on loopback: local names) |
| 429    | rate_limit_error      | every replica's queue is full (the server refused)            |
| 500    | server_error          | an engine failure                                             |
| 503    | service_unavailable   | no healthy replica, or a replica did not answer in time       |

The routes of text-embeddings-inference's API answer its shape instead, `{"error": message,
"error_type": kind}` (`ApiError.tei_body`), with the same statuses (docs/serving.md says where
they differ from TEI's).
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

from embedserve.errors import InputError

log = logging.getLogger("embedserve.gateway")
# the current request's X-Request-Id, where the app sets it: named in a server failure's answer
# and in its log line, which carries the details the answer leaves out
REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "embedserve_request_id", default=None
)

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}
# TEI's error kinds by our status (its own: validation, tokenizer, overloaded, backend,
# unhealthy, empty); the statuses TEI has no kind for keep our type's name
TEI_TYPES = {400: "validation", 413: "validation", 429: "overloaded", 500: "backend",
             503: "unhealthy"}  # fmt: skip


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers  # extra response headers (405's Allow, 401's WWW-Authenticate)

    def tei_body(self) -> dict[str, str]:
        """text-embeddings-inference's error shape, for its routes (its clients read `error`)."""
        kind = TEI_TYPES.get(self.status) or TYPES.get(self.status, "server_error")
        return {"error": self.message, "error_type": kind}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def from_input_error(error: InputError) -> ApiError:
    """The 400 of a request-core error: the same message the offline API raises."""
    return ApiError(400, error.message, param=error.param, code=error.code)


def server_failure(error: ApiError) -> ApiError:
    """The client's 500 for a server's failure: a generic message and the request id. NOTE:
    the server's text (an engine exception: process ids, memory figures, paths) goes to the
    gateway's log only."""
    request_id = REQUEST_ID.get()
    named = f" (request id {request_id})" if request_id else ""
    log.error("server failure%s: %s", named, error.message)
    return ApiError(
        500,
        f"the server failed on this request{named}; the gateway's log has the details",
        code="server_error",
    )
