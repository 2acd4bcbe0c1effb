"""The ASGI app in process: a client that disconnects cancels its work (and so its server calls);
one that disconnects while it sends its body is a clean 499, not an exception."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import numpy as np
import pytest

from embedserve.core.inputs import InputPreparer
from embedserve.gateway.app import GatewayApp
from embedserve.gateway.requests import Limits

LIMITS = Limits(hidden_size=4, max_inputs=8, model_names=("m",))
SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v1/embeddings",
    "headers": [(b"content-type", b"application/json")],
}


class SlowPipeline:
    """`embed` waits for `release`; records whether it was cancelled."""

    def __init__(self, inputs: InputPreparer) -> None:
        self.inputs = inputs
        self.pairs = None  # an embedding model
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = False

    async def embed(self, job: Any) -> tuple[np.ndarray, int]:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return np.ones((1, 4), dtype=np.float32), 3


def make_app(pipeline: SlowPipeline) -> GatewayApp:
    app = GatewayApp(lambda: pipeline, LIMITS, max_body_bytes=10_000)  # type: ignore[arg-type,return-value]
    app.pipeline = pipeline  # type: ignore[assignment]
    return app


def client(disconnect: asyncio.Event) -> Any:
    """ASGI receive: the body once, then (blocking) a disconnect when the event is set."""
    messages = [{"type": "http.request", "body": b'{"input": "hi"}', "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await disconnect.wait()
        return {"type": "http.disconnect"}

    return receive


def test_a_client_that_goes_away_cancels_its_work(inputs: InputPreparer) -> None:
    async def main() -> None:
        pipeline = SlowPipeline(inputs)
        sent: list[dict[str, Any]] = []
        disconnect = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        call = asyncio.ensure_future(make_app(pipeline)(SCOPE, client(disconnect), send))
        await asyncio.wait_for(pipeline.started.wait(), 5)
        disconnect.set()
        await asyncio.wait_for(call, 5)
        assert pipeline.cancelled
        assert sent == []  # nobody to answer

    asyncio.run(main())


def test_a_client_that_stays_gets_its_answer(inputs: InputPreparer) -> None:
    async def main() -> None:
        pipeline = SlowPipeline(inputs)
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        call = asyncio.ensure_future(make_app(pipeline)(SCOPE, client(asyncio.Event()), send))
        await asyncio.wait_for(pipeline.started.wait(), 5)
        pipeline.release.set()
        await asyncio.wait_for(call, 5)
        assert not pipeline.cancelled
        assert sent[0]["status"] == 200
        body = json.loads(sent[1]["body"])
        assert body["usage"]["prompt_tokens"] == 3
        assert body["data"][0]["embedding"] == [1.0, 1.0, 1.0, 1.0]

    asyncio.run(main())


def test_a_client_that_goes_away_during_its_upload_is_a_499_not_an_exception(
    inputs: InputPreparer, caplog: pytest.LogCaptureFixture
) -> None:
    """Half a body, then the disconnect (what uvicorn hands on when the socket closes): the app
    returns normally (an exception would be logged by uvicorn as one in the ASGI application)."""
    messages = [
        {"type": "http.request", "body": b'{"input": "h', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    pipeline = SlowPipeline(inputs)
    app = make_app(pipeline)
    app.log_requests = True
    with caplog.at_level(logging.INFO, logger="embedserve.gateway"):
        asyncio.run(app(SCOPE, receive, send))
    assert sent == [] and not pipeline.started.is_set()
    gone = [r for r in caplog.records if r.name == "embedserve.gateway"]
    assert [r.levelno for r in gone] == [logging.INFO] and "disconnected" in gone[0].getMessage()
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name.endswith(".requests")]
    assert line["status"] == 499 and line["route"] == "/v1/embeddings"
    exported = app.metrics.export(None).decode()
    assert 'route="/v1/embeddings",status="499"' in exported


def test_a_server_failure_answers_a_generic_500_naming_the_request_id(
    inputs: InputPreparer, caplog: pytest.LogCaptureFixture
) -> None:
    """The server's text (process ids, memory figures) goes to the gateway's log, not the
    client; the answer names the request so the two can be matched."""
    from embedserve.gateway.errors import ApiError, server_failure

    class FailingPipeline(SlowPipeline):
        async def embed(self, job: Any) -> tuple[np.ndarray, int]:
            raise server_failure(ApiError(500, "CUDA out of memory in pid 4242", code="x"))

    async def main() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {**SCOPE, "headers": [*SCOPE["headers"], (b"x-request-id", b"req-77")]}
        await make_app(FailingPipeline(inputs))(scope, client(asyncio.Event()), send)
        return sent

    with caplog.at_level(logging.ERROR, logger="embedserve.gateway"):
        sent = asyncio.run(main())
    assert sent[0]["status"] == 500
    message = json.loads(sent[1]["body"])["error"]["message"]
    assert "req-77" in message and "4242" not in message
    assert any("req-77" in r.getMessage() and "4242" in r.getMessage() for r in caplog.records)


def test_a_request_cut_by_the_drain_deadline_gets_a_json_503(inputs: InputPreparer) -> None:
    """uvicorn cancels what is left at the drain deadline and answered a plain-text 500."""

    async def main() -> None:
        pipeline = SlowPipeline(inputs)
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        app = make_app(pipeline)
        call = asyncio.ensure_future(app(SCOPE, client(asyncio.Event()), send))
        await asyncio.wait_for(pipeline.started.wait(), 5)
        app.draining = True
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        assert sent[0]["status"] == 503
        assert json.loads(sent[1]["body"])["error"]["code"] == "shutting_down"
        assert app.in_flight == 0

    asyncio.run(main())
