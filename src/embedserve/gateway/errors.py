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
"""

from __future__ import annotations

from typing import Any

from embedserve.errors import InputError

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
