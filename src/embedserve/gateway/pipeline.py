"""One embeddings request through the gateway: tokenize, chunk, fan out, re-assemble, encode.

Contextualized (late-chunking) requests take the same path with whole documents as sequences:
each document is tokenized once, its chunks' token spans come from the tokenizer's offsets
(`chunking.plan_document`), and the server answers one row per span (`span_bounds`).

Tokenization of a large request runs on a thread pool so the event loop keeps serving other
requests; a small one runs inline, where a thread hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.chunking import DEFAULT_SEPARATOR, DocumentPlan, join_chunks, plan_document
from embedserve.contract import EmbedRequest
from embedserve.gateway.errors import ApiError, bad_request
from embedserve.gateway.replicas import ReplicaPool
from embedserve.gateway.requests import ContextualJob, EmbedJob, Head
from embedserve.outputs import to_base64
from embedserve.spec import ModelSpec
from embedserve.tokenization import InputTooLong, TextTokenizer

INLINE_TOKENIZE_CHARS = 4096  # below this many characters, tokenize on the event loop


@dataclass(frozen=True)
class PipelineLimits:
    max_tokens_per_request: int
    chunk_tokens: int


def plan_chunks(lengths: Sequence[int], chunk_tokens: int) -> Iterator[tuple[int, int]]:
    """[start, end) ranges of consecutive sequences of at most `chunk_tokens` (or one longer)."""
    start, used = 0, 0
    for i, n in enumerate(lengths):
        if i > start and used + n > chunk_tokens:
            yield start, i
            start, used = i, 0
        used += n
    if start < len(lengths):
        yield start, len(lengths)


class Pipeline:
    def __init__(
        self,
        spec: ModelSpec,
        tokenizer: TextTokenizer,
        replicas: ReplicaPool,
        limits: PipelineLimits,
    ) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.replicas = replicas
        self.limits = limits
        self._threads = ThreadPoolExecutor(2, thread_name_prefix="tokenize")
        self._offsets_tokenizer: Any = None  # with offsets, for late chunking; loaded on first use

    def close(self) -> None:
        self._threads.shutdown(wait=False)

    def prompt(self, input_type: str | None) -> str:
        """The model's prompt for `query` / `document`; none when the model defines none."""
        name = input_type or self.spec.default_prompt_name
        return self.spec.prompts.get(name, "") if name else ""

    async def tokenize(
        self, texts: list[str], truncate: bool | str, input_type: str | None
    ) -> list[list[int]]:
        prompt = self.prompt(input_type)
        if prompt:
            texts = [prompt + t for t in texts]
        try:
            if sum(map(len, texts)) <= INLINE_TOKENIZE_CHARS:
                return self.tokenizer.encode(texts, truncate=truncate)  # type: ignore[arg-type]
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._threads,
                lambda: self.tokenizer.encode(texts, truncate=truncate),  # type: ignore[arg-type]
            )
        except InputTooLong as e:
            raise bad_request(
                f"input[{e.index}] has {e.num_tokens} tokens, over this model's limit of "
                f'{e.max_length}; shorten it or pass "truncate": "end" or "start"',
                param="input",
                code="context_length_exceeded",
            ) from None

    def check_token_ids(self, seqs: list[list[int]], truncate: bool | str) -> list[list[int]]:
        limit = self.spec.max_seq_length
        out = []
        for i, ids in enumerate(seqs):
            if len(ids) > limit:
                if truncate is False:
                    raise bad_request(
                        f"input[{i}] has {len(ids)} tokens, over this model's limit of {limit}; "
                        'shorten it or pass "truncate": "end" or "start"',
                        param="input",
                        code="context_length_exceeded",
                    )
                ids = ids[:limit] if truncate == "end" else ids[-limit:]
            out.append(ids)
        return out

    async def embed(self, job: EmbedJob) -> tuple[np.ndarray, int]:
        """Encoded vectors [num_inputs, width] in input order, and the number of prompt tokens."""
        if job.texts is not None:
            seqs = await self.tokenize(job.texts, job.truncate, job.input_type)
        else:
            seqs = self.check_token_ids(job.token_ids or [], job.truncate)
        lengths = [len(s) for s in seqs]
        num_tokens = sum(lengths)
        if num_tokens > self.limits.max_tokens_per_request:
            raise bad_request(
                f"the request has {num_tokens} tokens, over the limit of "
                f"{self.limits.max_tokens_per_request} per request",
                param="input",
                code="too_many_tokens",
            )
        chunks = list(plan_chunks(lengths, self.limits.chunk_tokens))
        calls = [
            self._embed_chunk(seqs[a:b], lengths[a:b], job) for a, b in chunks
        ]  # concurrently, to the least loaded replicas
        parts = await asyncio.gather(*calls) if len(calls) > 1 else [await calls[0]]
        vectors = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return vectors, num_tokens

    async def _embed_chunk(
        self,
        seqs: list[list[int]],
        lengths: list[int],
        head: EmbedJob | Head,
        spans: list[tuple[int, int]] | None = None,
    ) -> np.ndarray:
        """One server call: rows [num_seqs, width], or [num_spans, width] with `spans` (token
        offsets into these sequences packed back to back)."""
        if len(seqs) == 1:  # one query: no generator over its tokens
            ids = np.asarray(seqs[0], dtype="<i4")
        else:
            ids = np.fromiter((t for s in seqs for t in s), dtype="<i4", count=sum(lengths))
        request = EmbedRequest(
            input_ids=ids.tobytes(),
            seqlens=lengths,
            dimensions=head.dimensions,
            normalize=head.normalize,
            output_dtype=head.output_dtype,
            span_bounds=[x for span in spans for x in span] if spans else [],
        )
        response = await self.replicas.embed(request, sum(lengths))
        out = np.frombuffer(response.embeddings, dtype=np.dtype(response.dtype).newbyteorder("<"))
        shape = tuple(response.shape)
        num_rows = len(spans) if spans else len(seqs)
        if len(shape) != 2 or shape[0] != num_rows:
            raise ApiError(500, f"replica answered shape {shape} for {num_rows} rows")
        return out.reshape(shape)

    def plan_documents(self, documents: list[list[str]]) -> list[DocumentPlan]:
        """Each document joined and tokenized once; its chunks' token spans from the offsets."""
        if self._offsets_tokenizer is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(self.spec.path / "tokenizer.json"))
            tok.no_padding()
            tok.no_truncation()
            self._offsets_tokenizer = tok
        joined = [join_chunks(chunks, DEFAULT_SEPARATOR) for chunks in documents]
        encodings = self._offsets_tokenizer.encode_batch([text for text, _ in joined])
        limit = self.spec.max_seq_length
        plans = []
        for d, (encoding, (_, ranges)) in enumerate(zip(encodings, joined, strict=True)):
            if len(encoding.ids) > limit:
                raise bad_request(
                    f"input[{d}] has {len(encoding.ids)} tokens, over this model's limit of "
                    f"{limit} for one document; split it into several documents",
                    param="input",
                    code="context_length_exceeded",
                )
            try:
                plans.append(plan_document(encoding, ranges))
            except ValueError as e:  # a chunk of characters the tokenizer drops
                raise bad_request(f"input[{d}]: {e}", param="input") from None
        return plans

    async def contextual(self, job: ContextualJob) -> tuple[list[np.ndarray], int]:
        """Per document, encoded chunk vectors [num_chunks, width]; and the prompt tokens."""
        if sum(len(c) for d in job.documents for c in d) <= INLINE_TOKENIZE_CHARS:
            plans = self.plan_documents(job.documents)
        else:
            loop = asyncio.get_running_loop()
            plans = await loop.run_in_executor(self._threads, self.plan_documents, job.documents)
        lengths = [len(p.ids) for p in plans]
        num_tokens = sum(lengths)
        if num_tokens > self.limits.max_tokens_per_request:
            raise bad_request(
                f"the request has {num_tokens} tokens, over the limit of "
                f"{self.limits.max_tokens_per_request} per request",
                param="input",
                code="too_many_tokens",
            )
        calls = []
        for a, b in plan_chunks(lengths, self.limits.chunk_tokens):  # whole documents per call
            spans, offset = [], 0
            for plan in plans[a:b]:
                spans += [(start + offset, end + offset) for start, end in plan.spans]
                offset += len(plan.ids)
            seqs = [p.ids for p in plans[a:b]]
            calls.append(self._embed_chunk(seqs, lengths[a:b], job.head, spans))
        parts = await asyncio.gather(*calls) if len(calls) > 1 else [await calls[0]]
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        bounds = np.cumsum([0] + [len(p.spans) for p in plans])
        return [rows[bounds[d] : bounds[d + 1]] for d in range(len(plans))], num_tokens


def embedding_objects(vectors: np.ndarray, encoding_format: str) -> list[dict[str, Any]]:
    """`{"object": "embedding", "index": i, "embedding": ...}` per row; float rows stay NumPy
    arrays for orjson to write directly."""
    if encoding_format == "base64":
        rows: list[Any] = [to_base64(v) for v in vectors]
    else:
        rows = list(vectors)
    return [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]


def embeddings_body(
    vectors: np.ndarray, encoding_format: str, model: str, num_tokens: int
) -> dict[str, Any]:
    """The OpenAI response object."""
    return {
        "object": "list",
        "data": embedding_objects(vectors, encoding_format),
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def contextual_body(
    documents: list[np.ndarray], encoding_format: str, model: str, num_tokens: int
) -> dict[str, Any]:
    """Per document, a list object of its chunks' embedding objects (docs/serving.md)."""
    return {
        "object": "list",
        "data": [
            {"object": "list", "index": d, "data": embedding_objects(rows, encoding_format)}
            for d, rows in enumerate(documents)
        ],
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }
