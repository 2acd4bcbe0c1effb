"""A BERT tokenizer's faster twin for clean ASCII text: the same ids for less work.

A `BertNormalizer` (every BERT, MiniLM, BGE and e5 `tokenizer.json`) walks each character
through Unicode decomposition, accent stripping, CJK spacing and control-character cleaning. On
ASCII text with no control character that cleaning removes, all of that leaves only the lower-
casing: the twin has the same pre-tokenizer, vocabulary, template and truncation with `Lowercase`
(or nothing) as its normalizer. Measured on the Zen 5, one thread, 100 English passages (9,480
tokens), the two interleaved 15 times: 8.89 ms through the whole normalizer, 6.45 ms through the
twin (-27%), the same ids; on the H200 host's 16 threads 1.08x the tokens/s, 1.34x on one
(results/studies/tokenizer-rate-h200host16-20261204). Tokenizing bounds a GPU's bulk throughput
(issue 38).

Exactness, by rule of `BertNormalizer` (tokenizers' `normalizers/bert.rs`): on ASCII,
`clean_text` removes 0x00-0x08, 0x0b, 0x0c, 0x0e-0x1f and 0x7f (a text holding one goes the
whole way) and maps tab, newline and carriage return to a space, which the BERT pre-tokenizer
splits on as it does on a space; CJK spacing and accent stripping touch no ASCII character. The
mapped whitespace could only matter to another pre-tokenizer or to an added token matched after
normalization, so a tokenizer with either gets no twin. Tests compare both on texts built to hit
each rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from tokenizers import Tokenizer, normalizers

# the ASCII characters `clean_text` removes (not tab, newline or carriage return)
_REMOVED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def is_clean_ascii(text: str) -> bool:
    """ASCII with no character `clean_text` removes: the twin's ids are the tokenizer's."""
    return text.isascii() and _REMOVED.search(text) is None


def ascii_twin(tok: Tokenizer) -> Tokenizer | None:
    """The twin of `tok` in its current state (truncation included), or None unless `tok` has a
    cleaning `BertNormalizer`, a `BertPreTokenizer` and no added token matched after
    normalization."""
    spec = json.loads(tok.to_str())
    norm = spec.get("normalizer") or {}
    if norm.get("type") != "BertNormalizer" or not norm.get("clean_text", True):
        return None
    if (spec.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
        return None
    if any(added.get("normalized") for added in spec.get("added_tokens") or ()):
        return None
    twin = Tokenizer.from_str(tok.to_str())
    twin.normalizer = normalizers.Lowercase() if norm.get("lowercase", True) else None
    return twin


def ids_of(tok: Tokenizer, twin: Tokenizer | None, texts: Sequence[str]) -> list[list[int]]:
    """Each text's ids as `tok.encode_batch_fast` gives them; clean ASCII texts through `twin`."""
    if twin is None:
        return [e.ids for e in tok.encode_batch_fast(list(texts))]
    clean = [is_clean_ascii(t) for t in texts]
    if all(clean):
        return [e.ids for e in twin.encode_batch_fast(list(texts))]
    if not any(clean):
        return [e.ids for e in tok.encode_batch_fast(list(texts))]
    fast = iter(twin.encode_batch_fast([t for t, p in zip(texts, clean, strict=True) if p]))
    slow = iter(tok.encode_batch_fast([t for t, p in zip(texts, clean, strict=True) if not p]))
    return [next(fast if p else slow).ids for p in clean]
