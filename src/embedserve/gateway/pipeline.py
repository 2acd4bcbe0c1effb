"""One embeddings request through the gateway: prepare, split, fan out, re-assemble.

The request core (`embedserve.core.inputs`) turns the request's values into checked token-id
sequences; they are split into token-budget pieces of similar length
(`budget.by_length_groups`), each sent to the least loaded replica, and the encoded rows are put
back in input order. Two kinds of request need the pooled rows themselves, before any head:
`truncate: "chunk"` (windows averaged per input, then the head) and a reranker's scores (logits,
then its activation) ask the servers for raw float32 rows (`contract.codec`). Contextualized
(late-chunking) requests send whole documents with their chunks' token spans (`span_bounds`) and
get one row per span.

Preparing a large request (tokenization) runs on a thread pool so the event loop keeps serving
other requests; a small one runs inline, where a thread hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from embedserve.contract import tracing
from embedserve.contract.codec import (
    WireError,
    decode_outputs_response,
    decode_response,
    encode_request,
)
from embedserve.core import lanes
from embedserve.core.bounds import check_chars, document_chars, pair_chars, text_chars
from embedserve.core.budget import (
    by_length_groups,
    in_input_order,
    shift_spans,
    split_in_input_order,
    split_rows,
)
from embedserve.core.chunking import packed_spans
from embedserve.core.duplicates import unique_sequences
from embedserve.core.head import Head
from embedserve.core.inputs import InputOptions, InputPreparer, PreparedInputs
from embedserve.core.pairs import (
    PairPreparer,
    PreparedPairs,
    named,
    plan_cosine,
    read_documents,
    read_text,
    text_names,
)
from embedserve.gateway.coalescing import CALLS_IN_FLIGHT, Coalescer
from embedserve.gateway.errors import ApiError, bad_request, server_failure
from embedserve.gateway.output_bodies import OutputsJob, check_size
from embedserve.gateway.replicas import ReplicaPool
from embedserve.gateway.requests import ContextualJob, EmbedJob, Limits
from embedserve.gateway.result_cache import ResultCache
from embedserve.gateway.scoring import ScoreJob
from embedserve.gateway.timing import add_server_answer, add_tokenization
from embedserve.loading.labels import sigmoid
from embedserve.retrieval.inputs import ColbertInputs, OutputSequences, prepare_outputs
from embedserve.retrieval.results import EncodedOutputs, check_multivector_size, join_outputs
from embedserve.retrieval.scores import late_plan

INLINE_PREPARE_CHARS = 4096  # below this many characters, prepare on the event loop
TOKENIZE_THREADS = 2  # the pool large requests are prepared on
PARTS_IN_FLIGHT = 2  # parts of one request outstanding at once (see `_fan_out_parts`)
T = TypeVar("T")


@dataclass(frozen=True)
class PipelineLimits:
    max_tokens_per_request: int
    part_tokens: int  # tokens per server call (a part of a request)
    parts_in_flight: int = PARTS_IN_FLIGHT
    calls_in_flight: int | None = None  # small calls out (`Coalescer`; None: CALLS_IN_FLIGHT)


class Pipeline:
    def __init__(
        self,
        inputs: InputPreparer,
        replicas: ReplicaPool,
        limits: PipelineLimits,
        pairs: PairPreparer | None = None,
        cache: ResultCache | None = None,
    ) -> None:
        """`pairs`: a scoring model's request core (None: an embedding model, scoring by cosine);
        `cache`: this model's own result cache (None: off)."""
        self.inputs = inputs
        self.cache = ResultCache() if cache is None else cache
        self.pairs = pairs
        self.replicas = replicas
        self.limits = limits
        # the server calls of one loop turn as one message (`gateway.coalescing`)
        self.calls = Coalescer(
            lambda r, n: self.replicas.embed(r, n),
            limits.part_tokens,
            CALLS_IN_FLIGHT if limits.calls_in_flight is None else limits.calls_in_flight,
        )
        self.tokenize_threads = TOKENIZE_THREADS
        self._threads = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="tokenize")
        retrieval = inputs.spec.retrieval
        # a ColBERT model's sequences (markers, query expansion); None for any other model
        self.colbert = (
            ColbertInputs(retrieval.colbert, inputs.spec.path / "tokenizer.json")
            if retrieval is not None and retrieval.colbert is not None
            else None
        )

    def close(self) -> None:
        self._threads.shutdown(wait=False)

    async def _off_loop(self, size: int, work: Callable[[], T]) -> T:
        """`work()` (tokenizing `size` characters, as `core.bounds` counts them), refused
        before it starts past the request's character bound; on the thread pool when large;
        timed for the TEI headers."""
        check_chars(size, self.limits.max_tokens_per_request)
        start = time.perf_counter()
        try:
            if size <= INLINE_PREPARE_CHARS:
                return work()
            return await asyncio.get_running_loop().run_in_executor(self._threads, work)
        finally:
            add_tokenization(time.perf_counter() - start)

    async def tokenize(self, texts: Any, options: InputOptions) -> list[list[int]]:
        prepared = await self._off_loop(
            self._text_chars(texts, options), lambda: self.inputs.prepare(texts, options)
        )
        return prepared.seqs

    def _check_size(self, num_tokens: int, num_inputs: int = 1) -> None:
        lanes.settle(num_tokens, num_inputs)  # its lane, when its size decides (`core.lanes`)
        if num_tokens > self.limits.max_tokens_per_request:
            raise bad_request(
                f"the request has {num_tokens} tokens, over the limit of "
                f"{self.limits.max_tokens_per_request} per request",
                param="input",
                code="too_many_tokens",
            )

    async def embed(self, job: EmbedJob) -> tuple[np.ndarray, int]:
        """Encoded vectors [num_inputs, width] in input order, and the number of prompt tokens."""
        prepared = await self._prepare(job)
        num_tokens = sum(map(len, prepared.seqs))
        self._check_size(num_tokens, len(prepared.seqs))
        return await self._encode(prepared, job.head), num_tokens

    async def _prepare(self, job: EmbedJob) -> PreparedInputs:
        return await self._off_loop(
            self._text_chars(job.inputs, job.options),
            lambda: self.inputs.prepare(job.inputs, job.options),
        )

    def _text_chars(self, texts: Any, options: InputOptions) -> int:
        return text_chars(texts, options.prompt, options.truncate, self.inputs.tokenizer)

    async def _encode(self, prepared: PreparedInputs, head: Head) -> np.ndarray:
        """The prepared inputs' vectors, through the servers in token-budget parts."""
        seqs, back = unique_sequences(prepared.seqs)  # each distinct one once (`core.duplicates`)
        model_head = prepared.model_side_head(head)
        # the rows the result cache holds, the servers' for the others (off: all the servers')
        rows = await self.cache.rows(
            seqs, functools.partial(self._rows, head=model_head), model_head
        )
        return prepared.finish(rows if back is None else rows[back], head)

    async def _rows(self, seqs: Sequence[Sequence[int]], head: Head | None) -> np.ndarray:
        """Distinct sequences' model-side rows, in order: token-budget parts to the servers."""
        groups = by_length_groups([len(s) for s in seqs], self.limits.part_tokens)
        rows = await self._fan_out(
            [functools.partial(self._embed_part, [seqs[i] for i in g], head) for g in groups]
        )
        return in_input_order(rows, groups)

    async def score(self, job: ScoreJob) -> tuple[np.ndarray, int]:
        """One score per document [N] float32 in the job's order, and the prompt tokens."""
        lanes.interactive_route()
        if self.inputs.spec.retrieval is not None:
            return await self._late(job)
        if self.pairs is None:
            return await self._cosine(job)
        pairs = self.pairs
        size = sum(pair_chars(q, d) for q, d in job.groups)  # the query read once per document

        def prepare() -> list[PreparedPairs]:
            return [
                pairs.prepare(q, d, truncate=job.truncate, instruction=job.instruction, fields=f)
                for (q, d), f in zip(job.groups, job.fields(), strict=True)
            ]

        prepared = await self._off_loop(size, prepare)
        seqs = [s for p in prepared for s in p.seqs]
        rows, num_tokens = await self.raw_rows(
            seqs, [x for p in prepared for x in p.second_segment]
        )
        raw = rows[:, 0]  # one float32 logit per pair, activated here
        if job.scores == "raw":
            return raw.astype(np.float32), num_tokens
        if job.scores == "sigmoid":
            return sigmoid(raw), num_tokens
        return pairs.activate(raw), num_tokens

    async def raw_rows(
        self, seqs: list[list[int]], second_segment: list[int]
    ) -> tuple[np.ndarray, int]:
        """The model's raw float32 rows [len(seqs), width] for checked sequences (a reranker's
        logit, a classifier's logits per label), in order, and their tokens: token-budget
        parts across the replicas. `second_segment`: per sequence, where token type 1 begins."""
        lengths = [len(s) for s in seqs]
        num_tokens = sum(lengths)
        self._check_size(num_tokens, len(seqs))
        groups = by_length_groups(lengths, self.limits.part_tokens)
        rows = await self._fan_out(
            [
                functools.partial(
                    self._embed_part,
                    [seqs[i] for i in group],
                    None,
                    second_segment=[second_segment[i] for i in group],
                )
                for group in groups
            ]
        )
        return in_input_order(rows, groups), num_tokens

    async def _cosine(self, job: ScoreJob) -> tuple[np.ndarray, int]:
        """An embedding model's scores: the bi-encoder plan of the request core
        (`pairs.plan_cosine`), its two embeddings through the servers."""
        if job.scores == "raw":
            raise bad_request(
                "raw_scores are a reranker's logits; this embedding model scores by cosine",
                param="raw_scores",
            )
        fields = job.fields()
        plans = [
            plan_cosine(self.inputs, q, d, truncate=job.truncate, instruction=job.instruction,
                        fields=f)
            for (q, d), f in zip(job.groups, fields, strict=True)
        ]  # fmt: skip
        if not plans:
            return np.zeros(0, np.float32), 0
        # every group's query, and every group's documents, as one request each: the options
        # are the request's; the token limit is checked once, on both, before any part is sent;
        # an error names the text as sent (`pairs.named`)
        first = plans[0]
        query_names, document_names = text_names(fields, [len(p.documents) for p in plans])
        with named(query_names):
            queries = await self._prepare(
                EmbedJob([p.query for p in plans], first.query_options, first.head, "float")
            )
        with named(document_names):
            documents = await self._prepare(
                EmbedJob([d for p in plans for d in p.documents], first.document_options,
                         first.head, "float")
            )  # fmt: skip
        total = sum(map(len, queries.seqs)) + sum(map(len, documents.seqs))
        self._check_size(total)
        q = await self._encode(queries, first.head)
        d = split_rows(await self._encode(documents, first.head), [len(p.documents) for p in plans])
        return np.concatenate(
            [p.scores(q[i : i + 1], rows) for i, (p, rows) in enumerate(zip(plans, d, strict=True))]
        ), total

    async def _fan_out(self, calls: Sequence[Callable[[], Awaitable[np.ndarray]]]) -> np.ndarray:
        """The calls' rows concatenated in order (`_fan_out_parts`)."""
        one = len(calls) == 1
        return await calls[0]() if one else np.concatenate(await self._fan_out_parts(calls))

    async def _fan_out_parts(self, calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
        """The calls' answers in order, at most `parts_in_flight` outstanding at once: a large
        request enters the servers' queues a few parts at a time, so smaller requests sent
        meanwhile interleave with it instead of waiting behind all of it (and an idle server's
        queue never overflows with one request within the limits). When one part fails, or the
        client leaves, the parts still outstanding are cancelled (the servers drop them) and
        the rest are never sent."""
        parts: list[T | None] = [None] * len(calls)
        in_flight = asyncio.Semaphore(self.limits.parts_in_flight)

        async def run(i: int) -> None:
            async with in_flight:
                parts[i] = await calls[i]()

        try:
            async with asyncio.TaskGroup() as group:
                for i in range(len(calls)):
                    group.create_task(run(i))
        except BaseExceptionGroup as failed:  # the first part's error is the request's
            raise failed.exceptions[0] from None
        return parts  # type: ignore[return-value]  # every part answered

    async def _embed_part(
        self,
        seqs: Sequence[Sequence[int]],
        head: Head | None,
        spans: np.ndarray | None = None,
        second_segment: list[int] | None = None,
    ) -> np.ndarray:
        """One server call's rows; `spans`: token offsets into these sequences packed back to
        back; `head` None: raw float32 rows; `second_segment`: pairs' token types."""
        request = encode_request(seqs, head, spans=spans, second_segment=second_segment)
        response = await self._call(request, sum(map(len, seqs)))
        try:  # one row per sequence, or per span
            return decode_response(response, len(seqs) if spans is None else len(spans))
        except WireError as e:
            raise ApiError(500, str(e)) from None

    async def _call(self, request: Any, num_tokens: int) -> Any:
        """One server call's answer, traced when tracing; a server's 500 without its text."""
        tracing.stamp(request)  # the request's trace context, when tracing
        request.lane = lanes.current()
        try:
            response = await self.calls.embed(request, num_tokens)
            add_server_answer(response)
            return response
        except ApiError as e:
            if e.status == 500:  # the server's text stays in the gateway's log
                raise server_failure(e) from None
            raise

    # -- a sparse or multi-vector model's outputs (`gateway.output_bodies`) ----------------

    async def outputs(self, job: OutputsJob, limits: Limits) -> tuple[EncodedOutputs, int]:
        """The outputs of every input, in input order, and the prompt tokens; the answer's
        size and the token limit are checked before any part is sent."""
        prepared = await self._off_loop(
            self._text_chars(job.inputs, InputOptions(truncate=job.truncate)),
            lambda: prepare_outputs(
                self.inputs, self.colbert, job.inputs, input_type=job.input_type,
                prompt_name=job.prompt_name, prompt=job.prompt, truncate=job.truncate,
            ),
        )  # fmt: skip
        num_tokens = sum(map(len, prepared.seqs))
        self._check_size(num_tokens, len(prepared.seqs))
        check_size(prepared.vectors, limits, job.outputs)
        return await self._encode_outputs(prepared, job.outputs, job.head), num_tokens

    async def _encode_outputs(
        self, prepared: OutputSequences, outputs: tuple[str, ...], head: Head
    ) -> EncodedOutputs:
        seqs, visible = prepared.seqs, prepared.visible
        calls = []
        groups = by_length_groups([len(s) for s in seqs], self.limits.part_tokens)
        for group in groups:
            part = [seqs[i] for i in group]
            shown = None if visible is None else [visible[i] for i in group]
            request = encode_request(
                part, head, outputs=outputs, query=prepared.query, visible=shown
            )
            calls.append(functools.partial(self._outputs_part, request, len(part), outputs))
        return join_outputs(await self._fan_out_parts(calls), groups)

    async def _outputs_part(
        self, request: Any, num_seqs: int, outputs: tuple[str, ...]
    ) -> EncodedOutputs:
        response = await self._call(request, len(request.input_ids) // 4)
        try:
            return decode_outputs_response(response, num_seqs, outputs)
        except WireError as e:
            raise ApiError(500, str(e)) from None

    async def _late(self, job: ScoreJob) -> tuple[np.ndarray, int]:
        """A sparse or multi-vector model's scores (`retrieval.scores.late_plan`): every
        group's query as one request, every group's documents as another."""
        if job.scores == "raw" or job.instruction is not None:
            raise bad_request(
                "raw_scores and instruction are a reranker's; this model scores by its own "
                "outputs (MaxSim, sparse dot product, or bge-m3's weighted sum)",
                param="raw_scores" if job.scores == "raw" else "instruction",
            )
        assert self.inputs.spec.retrieval is not None
        plan = late_plan(self.inputs.spec.retrieval.kind, job.weights)
        head = self.inputs.head()

        fields = job.fields()
        query_names, document_names = text_names(fields, [len(d) for _, d in job.groups])

        def prepare() -> tuple[OutputSequences, OutputSequences]:
            side = functools.partial(
                prepare_outputs, self.inputs, self.colbert, truncate=job.truncate
            )
            pairs = list(zip(job.groups, fields, strict=True))
            queries = [read_text(q, f.query_name) for (q, _), f in pairs]
            documents = [d for (_, docs), f in pairs for d in read_documents(docs, f.documents)]
            with named(query_names):  # errors name the texts as sent
                q = side(queries, input_type=plan.query_type)
            with named(document_names):
                d = side(documents, input_type=plan.document_type)
            return q, d

        options = InputOptions(truncate=job.truncate)
        size = sum(
            self._text_chars(q, options) + self._text_chars(d, options) for q, d in job.groups
        )
        queries, documents = await self._off_loop(size, prepare)
        total = sum(map(len, queries.seqs)) + sum(map(len, documents.seqs))
        self._check_size(total)
        q = await self._encode_outputs(queries, plan.outputs, head)
        d = await self._encode_outputs(documents, plan.outputs, head)
        scores, start = [], 0
        for i, (_, docs) in enumerate(job.groups):
            stop = start + len(docs)
            scores.append(plan.scores(q.row(i), d.rows(start, stop)))
            start = stop
        return np.concatenate(scores), total

    async def token_states(self, job: EmbedJob, max_values: int) -> tuple[list[np.ndarray], int]:
        """Per input, its tokens' final hidden states [num_tokens, width] float32 (TEI's
        `/embed_all`), and the prompt tokens: one late-chunking span per token, so the servers
        pool each token alone, raw. An answer of over `max_values` floats is a 400 before any
        part is sent (tokens x hidden floats: 300k tokens were 1.2-4.5 GB built here)."""
        prepared = await self._prepare(job)
        lengths = [len(s) for s in prepared.seqs]
        num_tokens = sum(lengths)
        self._check_size(num_tokens)
        check_multivector_size(lengths, self.inputs.spec.hidden_size, max_values)
        calls = []
        groups = by_length_groups(lengths, self.limits.part_tokens)
        for group in groups:
            sizes = [lengths[i] for i in group]
            spans = shift_spans([[(t, t + 1) for t in range(n)] for n in sizes], sizes)
            seqs = [prepared.seqs[i] for i in group]
            calls.append(functools.partial(self._embed_part, seqs, None, spans))
        return split_in_input_order(await self._fan_out(calls), lengths, groups), num_tokens

    async def contextual(self, job: ContextualJob) -> tuple[list[np.ndarray], int]:
        """Per document, encoded chunk vectors [num_chunks, width]; and the prompt tokens."""
        plans = await self._off_loop(
            document_chars(job.documents),
            lambda: self.inputs.plan_documents(job.documents, job.separator),
        )
        lengths = [len(p.ids) for p in plans]
        num_tokens = sum(lengths)
        self._check_size(num_tokens)
        calls = []
        groups = by_length_groups(lengths, self.limits.part_tokens)  # whole documents
        for group in groups:
            part = [plans[d] for d in group]
            spans = packed_spans(part)
            calls.append(
                functools.partial(self._embed_part, [p.ids for p in part], job.head, spans)
            )
        rows = await self._fan_out(calls)
        return split_in_input_order(rows, [len(p.spans) for p in plans], groups), num_tokens
