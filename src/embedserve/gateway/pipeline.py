"""One embeddings request through the gateway: tokenize, chunk, fan out, re-assemble, encode.

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

from embedserve.gateway.errors import ApiError, bad_request
from embedserve.gateway.replicas import ReplicaPool
from embedserve.gateway.requests import EmbedJob
from embedserve.outputs import to_base64
from embedserve.server.rpc import EmbedRequest
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
        self, seqs: list[list[int]], lengths: list[int], job: EmbedJob
    ) -> np.ndarray:
        ids = np.fromiter((t for s in seqs for t in s), dtype="<i4", count=sum(lengths))
        request = EmbedRequest(
            input_ids=ids.tobytes(),
            seqlens=lengths,
            dimensions=job.dimensions,
            normalize=job.normalize,
            output_dtype=job.output_dtype,
        )
        response = await self.replicas.embed(request, sum(lengths))
        out = np.frombuffer(response.embeddings, dtype=np.dtype(response.dtype).newbyteorder("<"))
        shape = tuple(response.shape)
        if len(shape) != 2 or shape[0] != len(seqs):
            raise ApiError(500, f"replica answered shape {shape} for {len(seqs)} inputs")
        return out.reshape(shape)


def embeddings_body(
    vectors: np.ndarray, encoding_format: str, model: str, num_tokens: int
) -> dict[str, Any]:
    """The OpenAI response object; float rows stay NumPy arrays for orjson to write directly."""
    if encoding_format == "base64":
        rows: list[Any] = [to_base64(v) for v in vectors]
    else:
        rows = list(vectors)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)],
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }
