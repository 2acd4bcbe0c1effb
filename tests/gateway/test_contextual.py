"""/v1/contextualizedembeddings in the gateway, without processes: request validation, token
spans from offsets, documents split over server calls and put back in order."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve.contract import EmbedResponse
from embedserve.core.budget import budget_groups
from embedserve.core.chunking import packed_spans
from embedserve.core.inputs import InputPreparer
from embedserve.core.tokenization import TextTokenizer
from embedserve.gateway.bodies import contextual_body
from embedserve.gateway.errors import ApiError
from embedserve.gateway.pipeline import Pipeline, PipelineLimits
from embedserve.gateway.requests import Limits, parse_contextual
from embedserve.loading.spec import read_model_spec
from tests.gateway.conftest import api_error

LIMITS = Limits(384, max_inputs=3, model_names=("minilm",), max_chunks=4)


class SpanEcho:
    """A replica pool whose server answers row k = [first id, last id, length] of span k."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def embed(self, request: Any, num_tokens: int) -> Any:
        self.requests.append(request)
        ids = np.frombuffer(request.input_ids, dtype="<i4")
        spans = np.asarray(request.span_bounds, dtype=np.int64).reshape(-1, 2)
        rows = np.stack([ids[spans[:, 0]], ids[spans[:, 1] - 1], spans[:, 1] - spans[:, 0]], 1)
        rows = rows.astype(np.float32)
        return EmbedResponse(embeddings=rows.tobytes(), shape=list(rows.shape), dtype="float32")


@pytest.fixture
def pipeline(inputs: InputPreparer) -> Pipeline:
    limits = PipelineLimits(max_tokens_per_request=1000, part_tokens=24)
    return Pipeline(inputs, SpanEcho(), limits)  # type: ignore[arg-type]


DOCUMENTS = [
    ["The Eiffel Tower is in Paris.", "It is 330 metres tall."],
    ["one chunk"],
    ["Cut inside a wo", "rd: the straddling token belongs to both chunks.", "Third."],
]


def test_spans_come_from_offsets_and_documents_come_back_in_order(pipeline: Pipeline) -> None:
    job = parse_contextual({"input": DOCUMENTS, "output_dtype": "float32"}, LIMITS, pipeline.inputs)
    documents, num_tokens = asyncio.run(pipeline.contextual(job))
    plans = pipeline.inputs.plan_documents(DOCUMENTS)
    assert num_tokens == sum(len(p.ids) for p in plans)
    echo: SpanEcho = pipeline.replicas  # type: ignore[assignment]
    assert len(echo.requests) > 1  # 24-token calls: the documents were split over calls
    for rows, plan, chunks in zip(documents, plans, DOCUMENTS, strict=True):
        assert rows.shape == (len(chunks), 3)
        want = [[plan.ids[a], plan.ids[b - 1], b - a] for a, b in plan.spans]
        assert rows.tolist() == want
    # the spans are the chunks' own tokens: [CLS] and [SEP] in none
    tok = pipeline.inputs.tokenizer._full
    words = [tok.decode(plans[0].ids[a:b]) for a, b in plans[0].spans]
    assert words == ["the eiffel tower is in paris.", "it is 330 metres tall."]
    assert plans[0].spans[0][0] == 1 and plans[0].spans[-1][1] == len(plans[0].ids) - 1
    body = contextual_body(documents, "float", "minilm", num_tokens)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert [[c["index"] for c in d["data"]] for d in body["data"]] == [[0, 1], [0], [0, 1, 2]]
    assert body["data"][0]["object"] == "list"
    assert body["data"][0]["data"][0]["object"] == "embedding"


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ({}, "missing_required_parameter", "required"),
        ({"input": "a document"}, "invalid_type", "list of documents"),
        ({"input": []}, "invalid_value", "empty list of documents"),
        ({"input": [["a"]] * 4}, "too_many_inputs", "4 documents"),
        ({"input": ["a"]}, "invalid_type", "input[0] is str"),
        ({"input": [["a"], []]}, "invalid_value", "input[1] is a document with no chunks"),
        ({"input": [["a", "b", "c", "d", "e"]]}, "too_many_chunks", "5 chunks"),
        ({"input": [["a", ""]]}, "invalid_value", "input[0][1] is an empty chunk"),
        ({"input": [["a", " \n"]]}, "invalid_value", "input[0][1] is an empty chunk"),
        ({"input": [["a", 3]]}, "invalid_type", "input[0][1] is int"),
        ({"input": [["a"]], "dimensions": 0}, "invalid_value", "between 1 and 384"),
        ({"input": [["a"]], "dimensions": 385}, "invalid_value", "between 1 and 384"),
        ({"input": [["a"]], "truncate": "end"}, "unknown_parameter", "truncate"),
        ({"input": [["a"]], "encoding_format": "hex"}, "invalid_value", "encoding_format"),
    ],
)
def test_bad_requests_are_400s(
    inputs: InputPreparer, body: dict[str, Any], code: str, message: str
) -> None:
    error = api_error(lambda: parse_contextual(body, LIMITS, inputs))
    assert error.status == 400 and error.code == code
    assert message in error.message


def test_a_document_over_the_limit_is_400(pipeline: Pipeline) -> None:
    job = parse_contextual({"input": [["short"], ["word " * 300]]}, LIMITS, pipeline.inputs)
    error = api_error(lambda: asyncio.run(pipeline.contextual(job)))
    assert error.status == 400 and error.code == "context_length_exceeded"
    assert "input[1] has 302 tokens, over this model's limit of 256" in error.message


def test_a_request_over_the_token_limit_is_400(pipeline: Pipeline) -> None:
    pipeline.limits = PipelineLimits(max_tokens_per_request=500, part_tokens=24)
    job = parse_contextual({"input": [["word " * 200]] * 3}, LIMITS, pipeline.inputs)
    with pytest.raises(ApiError) as e:
        asyncio.run(pipeline.contextual(job))
    assert e.value.status == 400 and e.value.code == "too_many_tokens"
    assert "606 tokens, over the limit of 500" in e.value.message


def _document(num_chunks: int, num_tokens: int) -> list[str]:
    """`num_chunks` chunks of one-token words, `num_tokens` in all (MiniLM: "a" is one token)."""
    sizes = [num_tokens // num_chunks] * num_chunks
    sizes[-1] += num_tokens - sum(sizes)
    return [" ".join(["a"] * n) for n in sizes]


def _cpu(work: Callable[[], object]) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


@pytest.mark.parametrize(
    ("max_length", "num_documents", "num_chunks"),
    [(256, 1170, 14), (256, 64, 254), (32768, 9, 1024)],  # tokens, chunks, a long-context model
)
def test_a_request_at_the_limits_costs_little_gateway_cpu(
    minilm_path: Path, max_length: int, num_documents: int, num_chunks: int
) -> None:
    """The largest requests the default limits allow: 300,000 tokens, 16,384 chunks, checked,
    tokenized, planned and packed into parts in at most 0.5 s of CPU more than their
    tokenization alone costs (what any request of 300,000 tokens costs, on any route: 0.7 s on
    the loaded 2-core CPU). Planning cost chunks x tokens of Python: 26 s more at 32k tokens."""
    spec = dataclasses.replace(read_model_spec(minilm_path), max_seq_length=max_length)
    inputs = InputPreparer(spec, TextTokenizer(minilm_path / "tokenizer.json", max_length))
    limits = Limits(384, max_inputs=2048, model_names=("minilm",))
    documents = [_document(num_chunks, max_length - 2)] * num_documents  # + [CLS] and [SEP]
    assert num_documents * num_chunks <= limits.max_request_chunks
    assert num_documents * max_length <= 300_000
    joined = [" ".join(d) for d in documents]

    def tokenize() -> None:
        inputs.tokenizer.encode_with_offsets(joined)

    def plan_and_pack() -> tuple[list[Any], list[Any], list[int]]:
        job = parse_contextual({"input": documents}, limits, inputs)
        plans = inputs.plan_documents(job.documents, job.separator)
        lengths = [len(p.ids) for p in plans]
        parts = [packed_spans([plans[d] for d in g]) for g in budget_groups(lengths, 8192)]
        return plans, parts, lengths

    # NOTE: the least CPU of a few runs each: the tokenizer's threads make one run's CPU noisy on
    # a loaded machine, in both measurements alike
    tokenizing = min(_cpu(tokenize) for _ in range(3))
    seconds = min(_cpu(plan_and_pack) for _ in range(2))
    plans, parts, lengths = plan_and_pack()
    assert sum(len(p) for p in parts) == num_documents * num_chunks
    assert max(lengths) == max_length
    assert plans[0].spans[0] == (1, 1 + (max_length - 2) // num_chunks)
    assert seconds - tokenizing <= 0.5, (seconds, tokenizing)


def test_the_request_s_chunks_are_bounded(inputs: InputPreparer) -> None:
    limits = Limits(384, max_inputs=2048, model_names=("minilm",), max_request_chunks=10)
    error = api_error(lambda: parse_contextual({"input": [["a"] * 4] * 3}, limits, inputs))
    assert error.status == 400 and error.code == "too_many_chunks"
    assert "'input' has 12 chunks in all, over the limit of 10 per request" in error.message
