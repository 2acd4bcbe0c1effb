"""Token-level plans for two ways of embedding text around the model's limit (no torch).

- Late chunking (`plan_document`): a document given as ordered chunk strings is joined into one
  text and tokenized once; each chunk's span is the tokens whose characters overlap the chunk's
  characters, from the tokenizer's offsets. The span does not depend on how the chunk would
  tokenize alone; a token straddling two chunks belongs to both; separator-only tokens and
  special tokens belong to none.
- Windows (`split_windows`, `truncate="chunk"`): an input over the limit becomes consecutive
  windows of its content tokens, each wrapped in the input's leading special tokens, the prompt's
  tokens and the input's trailing special tokens, so every window is a well-formed input of at most
  `max_length` tokens. The caller averages the windows' pooled vectors, weighted by content
  tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding

from embedserve.core.budget import shift_spans

MAX_CHUNKS_PER_DOCUMENT = 1024
DEFAULT_SEPARATOR = " "


@dataclass(frozen=True)
class DocumentPlan:
    ids: list[int]  # the whole document's token ids, special tokens included
    spans: list[tuple[int, int]]  # per chunk: [start, end) token indices into `ids`


def join_chunks(chunks: Sequence[str], separator: str) -> tuple[str, list[tuple[int, int]]]:
    """The document text and each chunk's [start, end) character range in it."""
    ranges = []
    pos = 0
    for i, chunk in enumerate(chunks):
        if i:
            pos += len(separator)
        ranges.append((pos, pos + len(chunk)))
        pos += len(chunk)
    return separator.join(chunks), ranges


def plan_document(encoding: Encoding, char_ranges: Sequence[tuple[int, int]]) -> DocumentPlan:
    """Chunk token spans of one tokenized document (see the module docstring)."""
    offsets = encoding.offsets
    special = encoding.special_tokens_mask
    spans = []
    for c, (a, b) in enumerate(char_ranges):
        inside = [
            t
            for t, (s, e) in enumerate(offsets)
            if not special[t] and s < b and e > a  # the token's characters overlap the chunk's
        ]
        if not inside:
            raise ValueError(f"chunk {c} has no tokens of its own")
        spans.append((inside[0], inside[-1] + 1))  # offsets are monotonic: a contiguous run
    return DocumentPlan(list(encoding.ids), spans)


def packed_spans(plans: Sequence[DocumentPlan]) -> np.ndarray:
    """[K, 2] int64: every chunk span of `plans`, as token offsets once their documents are
    packed back to back in this order (what the server's `span_bounds` and `Engine.embed_spans`
    take)."""
    return shift_spans([p.spans for p in plans], [len(p.ids) for p in plans])


def split_windows(
    encoding: Encoding, prompt_ids: Sequence[int], max_length: int
) -> tuple[list[list[int]], int]:
    """Windows of at most `max_length` tokens covering the content of one input (see top), and
    how many tokens of each window are not content (special and prompt tokens).

    `encoding` is the input text alone; `prompt_ids` the prompt tokenized alone (no special
    tokens), repeated in every window after the leading special tokens.
    NOTE: not the tokens of prompt + text: BPE may merge across that boundary (Qwen3's
    pre-tokenizer joins "Query:" with the word after it), and a merged token belongs to neither.
    """
    ids, special = encoding.ids, encoding.special_tokens_mask
    n = len(ids)
    lead = 0
    while lead < n and special[lead]:
        lead += 1
    trail = n
    while trail > lead and special[trail - 1]:
        trail -= 1
    prefix, suffix = [*ids[:lead], *prompt_ids], ids[trail:]  # in every window
    content = ids[lead:trail]
    width = max_length - len(prefix) - len(suffix)
    if width <= 0:
        raise ValueError(
            f"the prompt and special tokens take {len(prefix) + len(suffix)} of the "
            f"{max_length} tokens a window may have"
        )
    windows = [prefix + content[i : i + width] + suffix for i in range(0, len(content), width)]
    return windows or [prefix + suffix], len(prefix) + len(suffix)
