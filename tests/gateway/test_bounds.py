"""Every request's characters are counted and bounded before the tokenizer reads any
(`core.bounds`): a 14 MB `truncate: "chunk"` text or a 1 MB query paired with 2,048 documents
is a 400 in milliseconds, where it cost tens of seconds of tokenizing (issue 40)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from embedserve.core.inputs import Head, InputOptions, InputPreparer
from embedserve.errors import InputError
from embedserve.gateway.errors import ApiError
from embedserve.gateway.pipeline import Pipeline, PipelineLimits
from embedserve.gateway.requests import ContextualJob, EmbedJob
from embedserve.gateway.scoring import ScoreJob
from tests.gateway.test_pipeline import CountingReplicas

TEXT = ("lorem ipsum dolor sit amet " * 600_000)[:14_000_000]


def refused(call: Any) -> tuple[InputError, float]:
    start = time.process_time()
    with pytest.raises(InputError) as caught:
        asyncio.run(call)
    return caught.value, time.process_time() - start


def pipeline(inputs: InputPreparer) -> Pipeline:
    return Pipeline(inputs, CountingReplicas(), PipelineLimits(300_000, 2048))  # type: ignore[arg-type]


def test_a_14_mb_chunked_text_is_refused_before_it_is_tokenized(inputs: InputPreparer) -> None:
    """It was tokenized whole to learn its tokens: 45.7 s and 1.3 GB kept."""
    job = EmbedJob(TEXT, InputOptions(truncate="chunk"), Head(384, True, "float32"), "float")
    error, cpu = refused(pipeline(inputs).embed(job))
    assert error.code == "too_many_characters" and "14000000" in error.message
    assert cpu < 0.1, cpu


def test_a_14_mb_contextualized_document_is_refused_before_it_is_tokenized(
    inputs: InputPreparer,
) -> None:
    job = ContextualJob([[TEXT]], None, Head(384, True, "float32"), "float")
    error, cpu = refused(pipeline(inputs).contextual(job))
    assert error.code == "too_many_characters" and cpu < 0.1, cpu


class NoPairs:
    """A reranker's request core that must not be reached."""

    def prepare(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the pairs were tokenized")


def test_a_long_query_times_many_documents_is_refused_before_it_is_paired(
    inputs: InputPreparer,
) -> None:
    """A reranker's tokenizer reads the query once per document (`core/pairs.py`): a 1 MB
    query with 2,048 documents is 2 GB of text."""
    reranker = Pipeline(inputs, CountingReplicas(), PipelineLimits(300_000, 2048), NoPairs())  # type: ignore[arg-type]
    job = ScoreJob([("what is it " * 100_000, ["a document"] * 2048)], False, None)
    error, cpu = refused(reranker.score(job))
    assert error.code == "too_many_characters" and cpu < 0.1, cpu
    assert "2252820480" in error.message  # 1.1 MB x 2,048 + the documents


def test_requests_within_the_bound_are_served(inputs: InputPreparer) -> None:
    head = Head(1, False, "float32")
    rows, tokens = asyncio.run(
        pipeline(inputs).embed(EmbedJob(["a text"] * 10, InputOptions(), head, "float"))
    )
    assert rows.shape[0] == 10 and tokens == 40
    # truncating counts one window per text: many long texts, each cut, are within it
    job = EmbedJob([TEXT[:60_000]] * 100, InputOptions(truncate="end"), head, "float")
    rows, tokens = asyncio.run(pipeline(inputs).embed(job))
    assert rows.shape[0] == 100 and tokens == 100 * 256  # MiniLM's limit


def test_embed_all_answers_are_bounded_before_any_part_is_sent(inputs: InputPreparer) -> None:
    """TEI's /embed_all answers tokens x hidden floats: 300k tokens were 1.2-4.5 GB built on the
    gateway. Past the bound (`--max-multivector-values`) it is a 400 before the servers run."""
    replicas = CountingReplicas()
    pipe = Pipeline(inputs, replicas, PipelineLimits(300_000, 2048))  # type: ignore[arg-type]
    job = EmbedJob(
        ["word " * 300] * 100, InputOptions(truncate="end"), Head(384, False, "float32"), "float"
    )
    with pytest.raises(InputError) as caught:
        asyncio.run(pipe.token_states(job, max_values=384 * 25_000))
    assert caught.value.code == "output_too_large" and replicas.calls == 0
    with pytest.raises(ApiError):  # within it: sent (the fake replicas answer a row a text)
        asyncio.run(pipe.token_states(job, max_values=384 * 25_600))
    assert replicas.calls > 0
