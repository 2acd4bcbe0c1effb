"""A BERT tokenizer's faster twin for clean ASCII text: the same ids for less work.

A `BertNormalizer` (every BERT, MiniLM, BGE and e5 `tokenizer.json`) walks each character
through Unicode decomposition, accent stripping, CJK spacing and control-character cleaning. On
ASCII text with no control character that cleaning removes, all of that leaves only the lower-
casing. What is left of the tokenizer on such text is small enough to do here:

- lower-case (`str.lower` on ASCII is the `Lowercase` normalizer's);
- split as `BertPreTokenizer` does: on whitespace (dropped) and around each ASCII punctuation
  character (kept as a word of its own) - one regular expression;
- each word to its WordPiece ids through the tokenizer's own model (`Model.tokenize`, so the
  longest-match rule, the `##` prefix, the unknown token and the 100-character limit are its
  own), remembered per word: text repeats its words, and a dictionary hit is far cheaper than
  any tokenizer call;
- the template's special tokens around them, cut first to the tokenizer's truncation.

Measured on the Zen 5, one thread, 1,000 passages (results/studies/tokenizer-rate-cpu2-20261204):
4.3M tokens/s against 1.40M for the Rust tokenizer with only `Lowercase` as its normalizer (the
twin of 2026-12-04) and 1.04M for the whole one. It holds the GIL, so the Rust twin (released GIL,
rayon's threads) is kept for a large batch in a process whose tokenizer pool has several threads
(`PARALLEL_THREADS`; results/studies/tokenizer-rate-h200host16-20261204-2). Tokenizing bounds a GPU's bulk throughput
and most of a gateway worker's CPU on 100-passage requests (issue 38).

Exactness, by rule of `BertNormalizer` (tokenizers' `normalizers/bert.rs`): on ASCII,
`clean_text` removes 0x00-0x08, 0x0b, 0x0c, 0x0e-0x1f and 0x7f (a text holding one goes the
whole way) and maps tab, newline and carriage return to a space, which the BERT pre-tokenizer
splits on as it does on a space; CJK spacing and accent stripping touch no ASCII character. The
mapped whitespace could only matter to another pre-tokenizer or to an added token matched after
normalization, so a tokenizer with either gets no twin; a text holding an added token (matched
on the raw text: `[CLS]`, `[MASK]`, ...) goes the whole way too. The twin checks itself against
the Rust tokenizer when it is made, and tests compare both on texts built to hit each rule.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Sequence

from tokenizers import Tokenizer, normalizers

from embedserve.memory import TOKENIZER_POOL

# the ASCII characters `clean_text` removes (not tab, newline or carriage return)
_REMOVED = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
_CLEAN = re.compile(_REMOVED)
# BertPreTokenizer on clean ASCII: runs of neither whitespace nor punctuation, and each ASCII
# punctuation character alone (`char::is_ascii_punctuation`: 0x21-0x2f, 0x3a-0x40, 0x5b-0x60,
# 0x7b-0x7e); `\s` meets only space, tab, newline and CR in clean ASCII
_PUNCT = r"!-/:-@\[-`{-~"
_WORDS = re.compile(rf"[^\s{_PUNCT}]+|[{_PUNCT}]")

# the words remembered per model (a few MB at most); a longer word is looked up every time
CACHE_WORDS = 1 << 16
CACHE_WORD_CHARS = 48
# From how many threads in the tokenizer's pool, and texts in a batch, the Rust twin on the pool
# is used instead. One Rust thread does 1/3 of this one's single thread (Zen 5: 1.40M against
# 4.3M tokens/s; H200 host: 0.48M against 1.55M), 4 do about as much (H200 host: 1.30M against
# 1.54M) and release the GIL: a gateway worker's loop goes on answering meanwhile. With the
# Python twin at a pool of 4 per worker, 100-passage requests on the H200 lost 13% (1.82M
# against 2.10M tokens/s, concurrency-h200-pytwin-20261204 against -before-); a 2-core CPU's
# gateway worker (a pool of 1) gains 2.5x per core (null-path-cpu2-20261204-3). A small batch gains little from a pool.
PARALLEL_THREADS = 4
PARALLEL_TEXTS = 64


def is_clean_ascii(text: str) -> bool:
    """ASCII with no character `clean_text` removes: the twin's ids are the tokenizer's."""
    return text.isascii() and _CLEAN.search(text) is None


def _pool_threads() -> int:
    """The threads of this process's tokenizer pool (rayon's: its variable, else a core each)."""
    try:
        return int(os.environ.get(TOKENIZER_POOL, "")) or os.cpu_count() or 1
    except ValueError:
        return os.cpu_count() or 1


class AsciiTwin:
    """`tok`'s ids of clean ASCII texts without its added tokens (`takes`), by `ids`."""

    def __init__(self, tok: Tokenizer, spec: dict, words: dict[str, tuple[int, ...]]) -> None:
        """`spec`: `tok`'s JSON; `words`: the word cache, shared by the twins of one model."""
        # the Rust twin: `Lowercase` (or nothing, cased) as its normalizer
        self.rust = Tokenizer.from_str(tok.to_str())
        lowercase = spec["normalizer"].get("lowercase", True)
        self.rust.normalizer = normalizers.Lowercase() if lowercase else None
        self._lower = lowercase
        added = [a["content"] for a in spec.get("added_tokens") or ()]
        # one scan per text: a removed character, or an added token matched on the raw text
        self._other = re.compile("|".join([_REMOVED, *map(re.escape, added)]))
        self._model = tok.model
        self._words = words
        plain = Tokenizer.from_str(tok.to_str())
        plain.no_truncation()
        probe = plain.encode("a")
        content = [i for i, special in enumerate(probe.special_tokens_mask) if not special]
        self._lead, self._trail = probe.ids[: content[0]], probe.ids[content[-1] + 1 :]
        cut = tok.truncation
        # the text's own tokens a truncating tokenizer keeps (None: all), and from which end
        self._keep = None if cut is None else cut["max_length"] - len(self._lead + self._trail)
        self._keep_end = cut is not None and cut["direction"] == "left"
        self.usable = self._keep is None or self._keep > 0
        # the check that this one and the Rust tokenizer agree, on every kind of character
        probes = ["Hello, WORLD! It's 3.14 - e.g. x_y (z) [a] {b}\tc\r\nd", "a", "", "x" * 120]
        self.usable = self.usable and self.ids(probes) == [e.ids for e in tok.encode_batch(probes)]

    def takes(self, text: str) -> bool:
        return text.isascii() and self._other.search(text) is None

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids; every text must be one this twin `takes`."""
        return [self._one(t) for t in texts]

    def _one(self, text: str) -> list[int]:
        words = self._words
        found = _WORDS.findall(text.lower() if self._lower else text)
        try:
            ids = list(itertools.chain.from_iterable([words[w] for w in found]))
        except KeyError:
            ids = list(itertools.chain.from_iterable([self._word(w) for w in found]))
        keep = self._keep
        if keep is not None and len(ids) > keep:
            ids = ids[-keep:] if self._keep_end else ids[:keep]
        return [*self._lead, *ids, *self._trail]

    def _word(self, word: str) -> tuple[int, ...]:
        ids = self._words.get(word)
        if ids is None:
            ids = tuple(t.id for t in self._model.tokenize(word))
            if len(word) <= CACHE_WORD_CHARS and len(self._words) < CACHE_WORDS:
                self._words[word] = ids
        return ids


def ascii_twin(tok: Tokenizer, words: dict[str, tuple[int, ...]] | None = None) -> AsciiTwin | None:
    """The twin of `tok` in its current state (truncation included), or None unless `tok` has a
    cleaning `BertNormalizer`, a `BertPreTokenizer`, a WordPiece model, no padding and no added
    token matched after normalization. `words`: a word cache to share with the model's other
    twins (default: its own)."""
    spec = json.loads(tok.to_str())
    norm = spec.get("normalizer") or {}
    if norm.get("type") != "BertNormalizer" or not norm.get("clean_text", True):
        return None
    if (spec.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
        return None
    if (spec.get("model") or {}).get("type") != "WordPiece" or spec.get("padding"):
        return None
    if any(added.get("normalized") for added in spec.get("added_tokens") or ()):
        return None
    twin = AsciiTwin(tok, spec, {} if words is None else words)
    return twin if twin.usable else None


def ids_of(tok: Tokenizer, twin: AsciiTwin | None, texts: Sequence[str]) -> list[list[int]]:
    """Each text's ids as `tok.encode_batch_fast` gives them; the texts `twin` takes through it
    (its Rust twin for a large batch where the tokenizer pool is large)."""
    texts = list(texts)
    if twin is None:
        return [e.ids for e in tok.encode_batch_fast(texts)]
    if len(texts) >= PARALLEL_TEXTS and _pool_threads() >= PARALLEL_THREADS:
        clean = [is_clean_ascii(t) for t in texts]  # added tokens are the Rust twin's own
        fast = [
            e.ids
            for e in twin.rust.encode_batch_fast(
                [t for t, c in zip(texts, clean, strict=True) if c]
            )
        ]
        return _merged(tok, texts, clean, fast)
    taken = [twin.takes(t) for t in texts]
    if all(taken):
        return twin.ids(texts)
    if not any(taken):
        return [e.ids for e in tok.encode_batch_fast(texts)]
    return _merged(tok, texts, taken, twin.ids([t for t, c in zip(texts, taken, strict=True) if c]))


def _merged(
    tok: Tokenizer, texts: list[str], taken: list[bool], ids: list[list[int]]
) -> list[list[int]]:
    """The ids of the texts taken (in order) and the rest's from `tok`, in the texts' order."""
    rest = [t for t, c in zip(texts, taken, strict=True) if not c]
    fast, slow = iter(ids), iter([e.ids for e in tok.encode_batch_fast(rest)] if rest else [])
    return [next(fast if c else slow) for c in taken]
