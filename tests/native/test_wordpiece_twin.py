"""The native tokenizer's WordPiece twin for clean ASCII (`native/src/ivy/wordpiece.rs`) gives
the ids of the tokenizer itself: on every ASCII character in words, on the whitespace
`clean_text` maps, on mixed batches (order kept, a text alone as in a batch, a large batch on
several threads), with each truncation, cased; and no twin is made where the rule that makes it
exact does not hold. The request core (`core.tokenization.TextTokenizer`) tokenizes through it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from embedserve._native import Tokenizer as NativeTokenizer
from embedserve.core.tokenization import TextTokenizer
from tests.core.request_core import minilm_folder

# every ASCII character between two words, at a word's edge and alone; tab, newline, CR runs
ASCII_TEXTS = [
    *(f"Alpha{chr(c)}beta {chr(c)}Gamma{chr(c)} {chr(c)}" for c in range(128)),
    "Tabs\tand\nnew\r\nlines\t\t end",
    "UPPER lower MiXeD [CLS] [MASK] literal specials",
    "punctuation!?;:'\"()[]{}<>@#$%^&*_-+=~`|\\/ and 3.14 numbers 1,000",
    "",
    "   ",
]
NOT_CLEAN = ["café au lait", "北京 Beijing", "no\u00a0break", "zero\u200bwidth", "mixed\x0bcontrol"]


def full_tokenizer(edit: dict | None = None) -> Tokenizer:
    spec = json.loads((minilm_folder() / "tokenizer.json").read_text())
    for key, value in (edit or {}).items():
        spec[key] = value
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.no_padding()
    tok.no_truncation()
    return tok


def reference(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch_fast(texts)]


def random_ascii(seed: int, count: int) -> list[str]:
    """Texts of every clean ASCII character, words of 1 to 130 letters among them (over the
    100-character limit: the unknown token)."""
    rnd = random.Random(seed)
    chars = [chr(c) for c in range(32, 127)] + ["\t", "\n", "\r"]
    out = []
    for _ in range(count):
        parts = [rnd.choice(chars) for _ in range(rnd.randint(0, 200))]
        parts.insert(rnd.randint(0, len(parts)), "x" * rnd.choice([1, 99, 100, 101, 130]))
        out.append("".join(parts))
    return out


def test_the_twin_gives_the_tokenizers_ids_on_every_ascii_character() -> None:
    tok = full_tokenizer()
    native = NativeTokenizer.from_str(tok.to_str())
    assert native.ascii_twin
    texts = [*ASCII_TEXTS, *random_ascii(1, 400)]
    assert native.encode_batch(texts) == reference(tok, texts)


def test_a_mixed_batch_keeps_its_order_and_each_texts_ids() -> None:
    tok = full_tokenizer()
    native = NativeTokenizer.from_str(tok.to_str())
    texts = [*ASCII_TEXTS, *NOT_CLEAN] * 16  # 44 KB, over 2 * PARALLEL_BYTES: rayon's threads
    random.Random(0).shuffle(texts)
    assert native.encode_batch(texts) == reference(tok, texts)
    assert [native.encode_batch([t])[0] for t in texts] == reference(tok, texts)


@pytest.mark.parametrize("direction", ["right", "left"])
def test_a_truncating_twin_keeps_the_tokenizers_end(direction: str) -> None:
    tok = full_tokenizer()
    tok.enable_truncation(9, direction=direction)
    native = NativeTokenizer.from_str(tok.to_str())
    texts = [*random_ascii(2, 200), "one", "two words here", ""]
    assert native.ascii_twin
    assert native.encode_batch(texts) == reference(tok, texts)
    assert max(map(len, native.encode_batch(texts))) == 9


def test_a_cased_bert_twin_keeps_the_case() -> None:
    spec = json.loads((minilm_folder() / "tokenizer.json").read_text())
    tok = full_tokenizer({"normalizer": {**spec["normalizer"], "lowercase": False}})
    native = NativeTokenizer.from_str(tok.to_str())
    assert native.ascii_twin
    assert native.encode_batch(ASCII_TEXTS) == reference(tok, ASCII_TEXTS)
    assert reference(tok, ["Paris"]) != reference(tok, ["paris"])  # the case does count


@pytest.mark.parametrize(
    "edit",
    [
        {"normalizer": {"type": "NFKC"}},
        {"normalizer": None},
        {"pre_tokenizer": {"type": "Metaspace", "replacement": "_", "prepend_scheme": "always"}},
        "cleaning off",
        "a normalized added token",
    ],
    ids=["nfkc", "none", "metaspace", "clean_text-false", "normalized-added-token"],
)
def test_no_twin_where_its_rule_does_not_hold(edit: dict | str) -> None:
    spec = json.loads((minilm_folder() / "tokenizer.json").read_text())
    if edit == "cleaning off":
        edit = {"normalizer": {**spec["normalizer"], "clean_text": False}}
    elif edit == "a normalized added token":
        added = {**spec["added_tokens"][0], "id": 30522, "content": "two words", "normalized": True}
        edit = {"added_tokens": [*spec["added_tokens"], added]}
    assert isinstance(edit, dict)
    tok = full_tokenizer(edit)
    native = NativeTokenizer.from_str(tok.to_str())
    assert not native.ascii_twin
    assert native.encode_batch(ASCII_TEXTS) == reference(tok, ASCII_TEXTS)


@pytest.mark.parametrize("truncate", [False, "end", "start"])
@pytest.mark.parametrize("prompt", ["", "Query: "])
def test_text_tokenizer_ids_are_the_python_packages(truncate: bool | str, prompt: str) -> None:
    """The request core through the native tokenizer, against the same rules on the package's
    own `encode_batch_fast` (long texts read in pieces too)."""
    path: Path = minilm_folder() / "tokenizer.json"
    ours = TextTokenizer(path, 12, window_chars=24)
    package = TextTokenizer(path, 12, window_chars=24)
    package._ids = lambda tok, texts: reference(tok, texts)  # type: ignore[method-assign]
    texts = [*ASCII_TEXTS, *NOT_CLEAN, " ".join(ASCII_TEXTS * 3)]
    if not truncate:
        texts = [t for t in texts if len(package.encode_plain(prompt + t)) <= 10]
    assert len(texts) > 100
    assert ours.encode(texts, truncate=truncate, prompt=prompt) == package.encode(
        texts, truncate=truncate, prompt=prompt
    )
