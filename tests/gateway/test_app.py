"""The ASGI app in process: a client that disconnects cancels its work (and so its server calls)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np

from embedserve.core.inputs import InputPreparer
from embedserve.gateway.app import GatewayApp
from embedserve.gateway.requests import Limits

LIMITS = Limits(hidden_size=4, max_inputs=8, model_names=("m",))
SCOPE = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": []}


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
