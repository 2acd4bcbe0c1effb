"""The characters a request makes the tokenizer read, counted before it reads any.

A request's tokens are bounded (`--max-tokens-per-request`), but tokens are only known once the
text is tokenized, and tokenizing costs what the characters weigh (~1-3 µs each on one core):
a 14 MB `truncate: "chunk"` text cost 45 s before its token count refused it, a 1 MB query
paired with 2,048 documents is 2 GB of text. So every front end's request is first counted in
characters, from the values as sent, and refused past `CHARS_PER_TOKEN` per allowed token.

What counts (`text_chars`, `pair_chars`, `document_chars`):
- a text tokenized whole (`truncate` false up to the tokenizer's `whole_chars`, `"chunk"`, a
  contextualized document, a pair's document): all its characters, the prompt's included;
- a text cut in pieces (`truncate` "end" / "start" past one window): its first window, which is
  what a text with places to cut costs (`TextTokenizer.max_piece_chars` bounds the rest);
- a pair: the query once per document (the tokenizer reads it again for each), and the document.

docs/serving.md ("Bounds") lists this beside every other bound of a request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from embedserve.core.tokenization import CHARS_PER_TOKEN, TextTokenizer
from embedserve.errors import InputError


def max_chars(max_tokens: int) -> int:
    """The characters a request of at most `max_tokens` tokens may make the tokenizer read."""
    return max_tokens * CHARS_PER_TOKEN


def _strings(value: Any, depth: int = 0) -> Iterable[str]:
    """The strings of an input value as sent: a string, a list of them, documents of chunks
    (three levels at most: anything deeper is no input, and the core says so)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)) and depth < 2:
        for item in value:
            yield from _strings(item, depth + 1)
    elif isinstance(value, dict) and isinstance(value.get("text"), str):
        yield value["text"]  # a document object


def text_chars(inputs: Any, prompt: str, truncate: Any, tokenizer: TextTokenizer) -> int:
    """The characters tokenizing `inputs` with `prompt` under `truncate` reads (see top)."""
    whole = tokenizer.window_chars if truncate in ("end", "start") else None
    total = 0
    for text in _strings(inputs):
        n = len(prompt) + len(text)
        if whole is not None or (truncate is False and n > tokenizer.whole_chars):
            n = min(n, whole or tokenizer.window_chars)
        total += n
    return total


def document_chars(documents: Any) -> int:
    """A contextualized request's characters: every chunk of every document, read whole."""
    return sum(len(chunk) + 1 for chunk in _strings(documents))


def pair_chars(query: Any, documents: Any) -> int:
    """A scoring request's characters: the query once per document, and each document."""
    docs = [len(d) for d in _strings(documents)]
    return len(query) * len(docs) + sum(docs) if isinstance(query, str) else sum(docs)


def check_chars(num_chars: int, max_tokens: int) -> None:
    """An `InputError` (400 `too_many_characters`) when `num_chars` is past `max_chars`."""
    limit = max_chars(max_tokens)
    if num_chars > limit:
        raise InputError(
            f"the request has {num_chars} characters to tokenize, over the limit of {limit} "
            f"({CHARS_PER_TOKEN} per token of its limit of {max_tokens} tokens); send fewer or "
            'shorter texts, or truncate "end" / "start" rather than "chunk"',
            code="too_many_characters",
        )
