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

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding

from embedserve.core.budget import shift_spans
from embedserve.errors import InputError

MAX_CHUNKS_PER_DOCUMENT = 1024
# chunks of all of a request's documents (the gateway's limit): each is a row of the answer, and
# checking, joining and planning them is Python per chunk (0.5 s of CPU for 300k)
MAX_CHUNKS_PER_REQUEST = 16384
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
    """Chunk token spans of one tokenized document (see the module docstring).

    One pass, by binary search over the tokens' character offsets (a scan of every token per
    chunk cost chunks x tokens: seconds for one request within the limits, issue 24).
    """
    # NOTE: fromiter over the flattened pairs: twice as fast as asarray on the list of tuples
    offsets = np.fromiter(itertools.chain.from_iterable(encoding.offsets), np.int64)
    offsets = offsets.reshape(-1, 2)
    own = np.flatnonzero(np.fromiter(encoding.special_tokens_mask, np.int8) == 0)
    starts, ends = offsets[own, 0], offsets[own, 1]
    bounds = np.asarray(char_ranges, dtype=np.int64).reshape(-1, 2)
    if np.all(starts[1:] >= starts[:-1]) and np.all(ends[1:] >= ends[:-1]):
        # a chunk's tokens [first, last): the first whose end is past the chunk's start, up to
        # the last that starts before the chunk's end
        first = np.searchsorted(ends, bounds[:, 0], side="right")
        last = np.searchsorted(starts, bounds[:, 1], side="left")
    else:  # offsets out of order (no tokenizer we know): each chunk against every token
        overlap = (starts[None, :] < bounds[:, 1:]) & (ends[None, :] > bounds[:, :1])
        first = np.where(overlap.any(1), overlap.argmax(1), len(own))
        last = np.where(overlap.any(1), len(own) - overlap[:, ::-1].argmax(1), 0)
    empty = np.flatnonzero(first >= last)
    if empty.size:
        raise ValueError(f"chunk {int(empty[0])} has no tokens of its own")
    a, b = own[first].tolist(), (own[last - 1] + 1).tolist()
    return DocumentPlan(list(encoding.ids), list(zip(a, b, strict=True)))


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
        raise InputError(
            f"the prompt takes {len(prompt_ids)} tokens and the special tokens "
            f"{len(prefix) + len(suffix) - len(prompt_ids)} of the {max_length} a window may "
            'have: no room is left for the text truncate "chunk" cuts into windows',
            param="prompt",
            code="context_length_exceeded",
        )
    windows = [prefix + content[i : i + width] + suffix for i in range(0, len(content), width)]
    return windows or [prefix + suffix], len(prefix) + len(suffix)
