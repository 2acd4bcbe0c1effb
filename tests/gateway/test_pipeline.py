"""A large request through the gateway's pipeline: its parts enter the servers a few at a time,
come back in order, and a failed part cancels the rest."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import pytest

from embedserve.contract import EmbedResponse
from embedserve.core.inputs import Head, InputOptions, InputPreparer
from embedserve.gateway.errors import REQUEST_ID, ApiError
from embedserve.gateway.pipeline import Pipeline, PipelineLimits
from embedserve.gateway.requests import EmbedJob
from embedserve.gateway.scoring import ScoreJob


class CountingReplicas:
    """Answers row i = [first id of sequence i]; records how many calls were outstanding."""

    def __init__(self, fail_on_call: int | None = None) -> None:
        self.outstanding = 0
        self.most_outstanding = 0
        self.calls = 0
        self.cancelled = 0
        self.finished = 0
        self.fail_on_call = fail_on_call

    async def embed(self, request: Any, num_tokens: int) -> Any:
        self.calls += 1
        call = self.calls
        self.outstanding += 1
        self.most_outstanding = max(self.most_outstanding, self.outstanding)
        try:
            await asyncio.sleep(0.01 if call != self.fail_on_call else 0.001)
            if call == self.fail_on_call:
                raise ApiError(503, "replica went away")
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.outstanding -= 1
        self.finished += 1
        ids = np.frombuffer(request.input_ids, dtype="<i4")
        starts = np.cumsum([0, *request.seqlens[:-1]])
        rows = ids[starts].astype(np.float32)[:, None]
        return EmbedResponse(embeddings=rows.tobytes(), shape=list(rows.shape), dtype="float32")


def job(num_inputs: int) -> EmbedJob:
    ids = [[100 + i, 7, 8] for i in range(num_inputs)]  # 3 tokens each
    return EmbedJob(ids, InputOptions(), Head(1, False, "float32"), "float")


def test_parts_are_bounded_in_flight_and_come_back_in_order(inputs: InputPreparer) -> None:
    replicas = CountingReplicas()
    limits = PipelineLimits(max_tokens_per_request=10_000, part_tokens=6, parts_in_flight=2)
    pipeline = Pipeline(inputs, replicas, limits)  # type: ignore[arg-type]
    rows, num_tokens = asyncio.run(pipeline.embed(job(20)))
    assert num_tokens == 60 and replicas.calls == 10  # 2 inputs per 6-token part
    assert replicas.most_outstanding == 2
    assert rows[:, 0].tolist() == [100 + i for i in range(20)]


def test_a_failed_part_cancels_the_others_and_sends_no_more(inputs: InputPreparer) -> None:
    replicas = CountingReplicas(fail_on_call=2)
    limits = PipelineLimits(max_tokens_per_request=10_000, part_tokens=6, parts_in_flight=2)
    pipeline = Pipeline(inputs, replicas, limits)  # type: ignore[arg-type]
    with pytest.raises(ApiError, match="replica went away"):
        asyncio.run(pipeline.embed(job(20)))
    # the parts outstanding beside the failed one were cancelled unless already answered (one
    # more may have started as the failed one left the window); the rest were never sent
    assert replicas.calls <= 3
    assert replicas.cancelled + replicas.finished == replicas.calls - 1
    assert replicas.outstanding == 0


class UnitRows(CountingReplicas):
    """Answers a unit row [1, 0] per sequence (every cosine is 1)."""

    async def embed(self, request: Any, num_tokens: int) -> Any:
        self.calls += 1
        rows = np.tile(np.asarray([[1.0, 0.0]], np.float32), (len(request.seqlens), 1))
        return EmbedResponse(embeddings=rows.tobytes(), shape=list(rows.shape), dtype="float32")


def test_an_embedding_model_s_scores_check_the_request_s_tokens_once(
    inputs: InputPreparer,
) -> None:
    """`/v1/score` pairs of an embedding model: the token limit is the request's, not each
    query group's (issue 24, item 13: ~2.1M tokens got through a 300k limit)."""
    groups = [(f"query {g}", ["a document of some words"] * 3) for g in range(40)]
    replicas = UnitRows()
    pipeline = Pipeline(inputs, replicas, PipelineLimits(1000, part_tokens=64))  # type: ignore[arg-type]
    scores, total = asyncio.run(pipeline.score(ScoreJob(groups, None, None)))
    assert scores.shape == (120,) and np.allclose(scores, 1.0) and total <= 1000
    pipeline.limits = PipelineLimits(total - 1, part_tokens=64)
    replicas.calls = 0
    with pytest.raises(ApiError) as e:  # each group is far under the limit, all are over it
        asyncio.run(pipeline.score(ScoreJob(groups, None, None)))
    assert e.value.code == "too_many_tokens" and f"has {total} tokens" in e.value.message
    assert replicas.calls == 0  # before any part is sent


class FailingReplicas:
    """A replica pool whose server failed: the pool's 500 carries the server's own text."""

    async def embed(self, request: Any, num_tokens: int) -> Any:
        raise ApiError(
            500,
            "server replica 0 failed: INTERNAL engine failure: RuntimeError: CUDA out of "
            "memory (pid 4242; 3.20 GiB reserved)",
            code="server_error",
        )


def test_a_server_s_failure_text_stays_in_the_log(
    inputs: InputPreparer, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = Pipeline(inputs, FailingReplicas(), PipelineLimits(1000, 64))  # type: ignore[arg-type]
    token = REQUEST_ID.set("req-7")
    try:
        with caplog.at_level(logging.ERROR, "embedserve.gateway"), pytest.raises(ApiError) as e:
            asyncio.run(pipeline.embed(job(2)))
    finally:
        REQUEST_ID.reset(token)
    assert e.value.status == 500 and e.value.code == "server_error"
    assert "req-7" in e.value.message and "the gateway's log" in e.value.message
    assert "pid" not in e.value.message and "GiB" not in e.value.message
    assert "req-7" in caplog.text and "pid 4242; 3.20 GiB" in caplog.text


def test_duplicate_inputs_are_sent_once_and_copied_in_order(inputs: InputPreparer) -> None:
    """Issue 56: identical sequences of one request go to the servers once; every input gets its
    row, in order, and the usage still counts every input's tokens."""
    replicas = CountingReplicas()
    limits = PipelineLimits(max_tokens_per_request=10_000, part_tokens=1_000, parts_in_flight=2)
    pipeline = Pipeline(inputs, replicas, limits)  # type: ignore[arg-type]
    ids = [[100 + i % 3, 7, 8] for i in range(9)]  # three distinct, each three times
    sent: list[int] = []
    embed = replicas.embed

    async def recording(request: Any, num_tokens: int) -> Any:
        sent.append(len(request.seqlens))
        return await embed(request, num_tokens)

    replicas.embed = recording  # type: ignore[method-assign]
    rows, num_tokens = asyncio.run(
        pipeline.embed(EmbedJob(ids, InputOptions(), Head(1, False, "float32"), "float"))
    )
    assert sum(sent) == 3 and num_tokens == 27
    assert rows[:, 0].tolist() == [100 + i % 3 for i in range(9)]
