"""The local transport: Embed calls over a unix socket behave as gRPC calls do (answers, status
codes, deadlines, cancellation, a server that goes away and comes back)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from embedserve.contract import EmbedRequest, EmbedResponse
from embedserve.contract.local import (
    Frames,
    LocalEmbedClient,
    frame,
    local_socket_for,
    socket_path,
)
from embedserve.server.local import serve_local
from embedserve.server.service import RequestFailed


def request(first_id: int) -> Any:
    ids = np.array([first_id, 2, 3], dtype="<i4")
    return EmbedRequest(input_ids=ids.tobytes(), seqlens=[3], output_dtype="float32")


class Answers:
    """Answers with the request's first id; 0 fails it, 1 blocks until cancelled."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def __call__(self, req: Any) -> Any:
        first = int(np.frombuffer(req.input_ids, dtype="<i4")[0])
        if first == 0:
            raise RequestFailed(grpc.StatusCode.INVALID_ARGUMENT, "token ids must be in [0, 9)")
        if first == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        row = np.array([[first]], dtype="<f4")
        return EmbedResponse(embeddings=row.tobytes(), shape=[1, 1], dtype="float32")


def test_calls_answers_and_status_codes(tmp_path: Path) -> None:
    async def main() -> None:
        answers = Answers()
        server = await serve_local(tmp_path / "s.sock", answers)
        client = LocalEmbedClient(tmp_path / "s.sock")
        replies = await asyncio.gather(*(client(request(i), timeout=5) for i in range(5, 25)))
        assert [np.frombuffer(r.embeddings, "<f4")[0] for r in replies] == list(range(5, 25))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await client(request(0), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == "token ids must be in [0, 9)"
        # a deadline cancels the call in the server too
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await client(request(1), timeout=0.1)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(answers.cancelled.wait(), 5)
        # so does a caller that goes away
        answers.cancelled.clear()
        call = asyncio.ensure_future(client(request(1), timeout=5))
        await asyncio.sleep(0.1)
        call.cancel()
        await asyncio.wait_for(answers.cancelled.wait(), 5)
        await client.close()
        await server.stop(1)
        assert not (tmp_path / "s.sock").exists()

    asyncio.run(main())


def test_a_server_that_goes_away_is_unavailable_until_it_returns(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "s.sock"
        server = await serve_local(path, Answers())
        client = LocalEmbedClient(path)
        await client(request(7), timeout=5)
        pending = asyncio.ensure_future(client(request(1), timeout=5))
        await asyncio.sleep(0.1)
        await server.stop(0)  # gone with a call in flight
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await pending
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await client(request(7), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        server = await serve_local(path, Answers())  # restarted on the same socket
        reply = await client(request(8), timeout=5)
        assert np.frombuffer(reply.embeddings, "<f4")[0] == 8
        await client.close()
        await server.stop(1)

    asyncio.run(main())


def test_only_a_listening_server_on_this_host_is_local(tmp_path: Path) -> None:
    port = 1  # no server listens on a socket for port 1
    assert local_socket_for(f"127.0.0.1:{port}") is None
    assert local_socket_for("10.0.0.7:50051") is None
    path = socket_path(port)
    path.touch()
    try:
        assert local_socket_for(f"localhost:{port}") == path
    finally:
        path.unlink()


def fed(chunks: list[bytes]) -> list[tuple[int, int, bytes]]:
    got: list[tuple[int, int, bytes]] = []
    frames = Frames(lambda *f: got.append(f))
    for chunk in chunks:
        frames.feed(chunk)
    return got


def test_frames_come_out_whole_however_the_stream_is_cut() -> None:
    sent = [(1, 0, b"abc"), (2, 1, b""), (3, 14, b"x" * 70_000), (4, 0, b"\x00" * 9)]
    stream = b"".join(frame(*f) for f in sent)
    for cuts in ([], [1], [5, 9, 10], list(range(1, len(stream))), [len(stream) - 1]):
        edges = [0, *cuts, len(stream)]
        assert fed([stream[a:b] for a, b in itertools.pairwise(edges)]) == sent, cuts
    # the last frame incomplete: held back, not handed on
    assert fed([stream[:-1]]) == sent[:-1]
