"""Errors in what a caller asked for: one message per mistake, whichever front end it came through.

`InputError` carries the name of the offending parameter and a short machine-readable code, so
the HTTP gateway turns any of them into an OpenAI-shaped 400 in one place while the offline API
raises them as they are (they are `ValueError`s; a value of the wrong type is also a `TypeError`).
"""

from __future__ import annotations


class InputError(ValueError):
    """A value a caller passed that cannot be served as it is."""

    def __init__(self, message: str, *, param: str = "input", code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InputTypeError(InputError, TypeError):
    """A value of the wrong type (a number where a string belongs, ...)."""

    def __init__(self, message: str, *, param: str = "input") -> None:
        super().__init__(message, param=param, code="invalid_type")


class InputTooLong(InputError):
    """An input over the model's token limit, with no truncation asked for."""

    def __init__(self, where: str, num_tokens: int, max_length: int, advice: str) -> None:
        super().__init__(
            f"{where} has {num_tokens} tokens, over this model's limit of {max_length}; {advice}",
            code="context_length_exceeded",
        )
        self.where = where
        self.num_tokens = num_tokens
        self.max_length = max_length


# What to do about an over-long input, for the inputs `truncate` applies to.
TRUNCATE_ADVICE = (
    'shorten it or pass truncate "end" (keep the beginning), "start" (keep the end) or '
    '"chunk" (average of windows)'
)


def shown(value: object) -> str:
    """A value as the caller wrote it: JSON where it is JSON (`true`, `"x"`, `null`), so an HTTP
    client reads its own value back; Python's repr otherwise."""
    import json

    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
