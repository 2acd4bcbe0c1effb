"""TEI's gRPC messages read as TEI's HTTP bodies, and the gateway's errors as gRPC codes."""

from __future__ import annotations

import grpc
import pytest

from embedserve.contract import tei
from embedserve.gateway.errors import ApiError
from embedserve.gateway.tei_grpc import body_of, status_code


def test_an_unset_optional_field_is_absent_and_plain_fields_are_sent() -> None:
    body = body_of(tei.message("EmbedRequest")(inputs="hi"))
    # normalize / prompt_name / dimensions unset: the route's defaults apply
    assert body == {"inputs": "hi", "truncate": False, "truncation_direction": "Right"}
    body = body_of(
        tei.message("EmbedRequest")(
            inputs="", normalize=False, dimensions=8, truncation_direction=1
        )
    )
    assert body["normalize"] is False and body["dimensions"] == 8
    assert body["inputs"] == ""  # an empty text is one, as over HTTP (the core says so)
    assert body["truncation_direction"] == "Left"


def test_repeated_fields_become_lists() -> None:
    body = body_of(tei.message("RerankRequest")(query="q", texts=["a", "b"], return_text=True))
    assert body["texts"] == ["a", "b"] and isinstance(body["texts"], list)
    assert body_of(tei.message("DecodeRequest")(ids=[101, 102]))["ids"] == [101, 102]


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (400, "invalid_value", grpc.StatusCode.INVALID_ARGUMENT),
        (413, "too_large", grpc.StatusCode.INVALID_ARGUMENT),
        (400, "wrong_model_task", grpc.StatusCode.FAILED_PRECONDITION),
        (401, "invalid_api_key", grpc.StatusCode.UNAUTHENTICATED),
        (429, "queue_full", grpc.StatusCode.RESOURCE_EXHAUSTED),
        (501, "not_implemented", grpc.StatusCode.UNIMPLEMENTED),
        (503, "no_healthy_replica", grpc.StatusCode.UNAVAILABLE),
        (504, "timeout", grpc.StatusCode.DEADLINE_EXCEEDED),
        (500, "server_error", grpc.StatusCode.INTERNAL),
    ],
)
def test_statuses_map_to_grpc_codes(status: int, code: str, expected: grpc.StatusCode) -> None:
    assert status_code(ApiError(status, "x", code=code)) == expected


def test_a_rerank_stream_is_refused_once_past_the_limits_not_kept_whole() -> None:
    """Every streamed text was kept before any limit: an endless stream grew without bound."""
    import asyncio
    from types import SimpleNamespace

    from embedserve.gateway.tei_grpc import TeiGrpc

    model = SimpleNamespace(limits=SimpleNamespace(max_inputs=8), started=lambda: None)
    served = SimpleNamespace(pick=lambda data, task: model)
    grpc_api = object.__new__(TeiGrpc)
    grpc_api.app = SimpleNamespace(served=served, max_body_bytes=1000)  # type: ignore[assignment]
    sent = 0

    async def endless(text: str):  # type: ignore[no-untyped-def]
        nonlocal sent
        while True:
            sent += 1
            yield tei.message("RerankStreamRequest")(query="q", text=text)

    for text, code, most in (("a doc", "too_many_inputs", 9), ("x" * 400, "body_too_large", 3)):
        sent = 0
        with pytest.raises(ApiError) as caught:
            asyncio.run(grpc_api.rerank_stream(endless(text)))
        assert caught.value.code == code and sent == most, (caught.value.message, sent)
