"""Embedding past one input's limits, on top of an `Embedder`: late chunking and windows.

`Embedder.encode_contextual` and `Embedder.encode(..., truncate="chunk")` call these; the token
plans are in `chunking` (no torch), the span pooling in `engine.spans`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from embedserve.chunking import check_chunks, join_chunks, plan_document, split_windows
from embedserve.engine.batch import PackedBatch
from embedserve.tokenization import InputTooLong

if TYPE_CHECKING:
    from embedserve.embedder import Embedder


def offsets_tokenizer(embedder: Embedder) -> Any:
    """The model's tokenizer with offsets and special-token masks (no truncation, no padding)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(embedder.spec.path / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def contextual_pooled(
    embedder: Embedder,
    documents: Sequence[Sequence[str]],
    *,
    separator: str,
    max_chunks: int,
    batch_tokens: int,
) -> list[np.ndarray]:
    """Per document, [num_chunks, hidden] float32: each chunk's mean over its token span of the
    whole document's hidden states (one forward per document; documents batched by tokens)."""
    if isinstance(documents, str) or not isinstance(documents, (list, tuple)) or not documents:
        raise ValueError("documents must be a non-empty list of lists of chunk strings")
    checked = [check_chunks(d, i, max_chunks) for i, d in enumerate(documents)]
    joined = [join_chunks(chunks, separator) for chunks in checked]
    encodings = embedder.tokenizer_with_offsets().encode_batch([text for text, _ in joined])
    limit = embedder.spec.max_seq_length
    plans = []
    for i, (enc, (_, ranges)) in enumerate(zip(encodings, joined, strict=True)):
        if len(enc.ids) > limit:
            raise InputTooLong(i, len(enc.ids), limit)
        try:
            plans.append(plan_document(enc, ranges))
        except ValueError as e:
            raise ValueError(f"document {i}: {e}") from None
    out: list[np.ndarray] = []
    # documents back to back in token-budget batches; spans shifted to packed positions
    start = 0
    while start < len(plans):
        end, used = start, 0
        while end < len(plans) and (end == start or used + len(plans[end].ids) <= batch_tokens):
            used += len(plans[end].ids)
            end += 1
        group = plans[start:end]
        batch = PackedBatch.from_token_lists([p.ids for p in group])
        spans = np.array(
            [
                (a + int(batch.cu_seqlens[k]), b + int(batch.cu_seqlens[k]))
                for k, p in enumerate(group)
                for a, b in p.spans
            ],
            dtype=np.int64,
        )
        pooled = embedder.engine.embed_spans(batch, spans)
        k = 0
        for p in group:
            out.append(pooled[k : k + len(p.spans)])
            k += len(p.spans)
        start = end
    return out


def windows_pooled(
    embedder: Embedder,
    items: list[Any],
    text_prompt: str,
    batch_tokens: int,
) -> np.ndarray:
    """[num_inputs, hidden]: inputs within the limit as they are; a longer one as the average
    of its windows' pooled vectors, weighted by each window's content tokens."""
    limit = embedder.spec.max_seq_length
    windows: list[list[list[int]]] = []
    weights: list[list[int]] = []
    if all(isinstance(x, (list, tuple, np.ndarray)) and len(x) > 0 for x in items):
        # token ids: no special tokens known, so plain consecutive windows
        vocab = embedder.tokenizer.vocab_size
        for i, x in enumerate(items):
            ids = [int(t) for t in x]
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise ValueError(
                    f"input {i}: token id {bad} is outside the vocabulary [0, {vocab})"
                )
            windows.append([ids[j : j + limit] for j in range(0, len(ids), limit)])
            weights.append([len(w) for w in windows[-1]])
    else:
        for i, x in enumerate(items):
            if not isinstance(x, str) or not x:
                raise ValueError(f"input {i} must be a non-empty string")
        tok = embedder.tokenizer_with_offsets()
        prompt_ids = tok.encode(text_prompt, add_special_tokens=False).ids if text_prompt else []
        joined = tok.encode_batch([text_prompt + x for x in items])
        for i, enc in enumerate(joined):
            if len(enc.ids) <= limit:  # as `encode` without truncation would embed it
                windows.append([list(enc.ids)])
                weights.append([1])
                continue
            parts, overhead = split_windows(tok.encode(items[i]), prompt_ids, limit)
            windows.append(parts)
            weights.append([len(p) - overhead for p in parts])
    flat = [w for ws in windows for w in ws]
    pooled = embedder.embed_ids(flat, batch_tokens=batch_tokens)
    out = np.empty((len(windows), embedder.spec.hidden_size), dtype=np.float32)
    k = 0
    for i, ws in enumerate(windows):
        wts = np.asarray(weights[i], dtype=np.float64)[:, None]
        out[i] = (pooled[k : k + len(ws)] * wts).sum(0) / wts.sum()
        k += len(ws)
    return out
