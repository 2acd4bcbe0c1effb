"""The clean-ASCII twin of a BERT tokenizer (`core.ascii_twin`) gives the ids of the tokenizer
itself: on every ASCII character in words, on the whitespace `clean_text` maps, on mixed batches
(order kept), through `TextTokenizer` with each truncation; and no twin is made where the rule
that makes it exact does not hold."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from embedserve.core import ascii_twin as twins
from embedserve.core.ascii_twin import ascii_twin, ids_of, is_clean_ascii
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


def full_tokenizer(path: Path, edit: dict | None = None) -> Tokenizer:
    spec = json.loads(path.read_text())
    for key, value in (edit or {}).items():
        spec[key] = value
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.no_padding()
    tok.no_truncation()
    return tok


def reference(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch_fast(texts)]


# the 30 ASCII characters `clean_text` removes
REMOVED = {*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F}


def test_clean_ascii_is_ascii_without_the_characters_clean_text_removes() -> None:
    removed = REMOVED
    assert [c for c in range(128) if not is_clean_ascii(f"a{chr(c)}b")] == sorted(removed)
    assert not any(map(is_clean_ascii, NOT_CLEAN))


def test_the_twin_gives_the_tokenizers_ids_on_every_ascii_character() -> None:
    tok = full_tokenizer(minilm_folder() / "tokenizer.json")
    twin = ascii_twin(tok)
    assert twin is not None
    clean = [t for t in ASCII_TEXTS if is_clean_ascii(t)]
    assert len(clean) == len(ASCII_TEXTS) - len(REMOVED)
    assert reference(twin.rust, clean) == reference(tok, clean)
    taken = [t for t in clean if twin.takes(t)]
    assert len(taken) == len(clean) - 1  # the one with literal special tokens goes the whole way
    assert twin.ids(taken) == reference(tok, taken)
    assert ids_of(tok, twin, ASCII_TEXTS) == reference(tok, ASCII_TEXTS)


def test_a_mixed_batch_keeps_its_order_and_each_texts_ids() -> None:
    tok = full_tokenizer(minilm_folder() / "tokenizer.json")
    texts = [*ASCII_TEXTS, *NOT_CLEAN]
    random.Random(0).shuffle(texts)
    assert ids_of(tok, ascii_twin(tok), texts) == reference(tok, texts)
    # alone equals in the batch
    assert [ids_of(tok, ascii_twin(tok), [t])[0] for t in texts] == reference(tok, texts)


def test_a_cased_bert_twin_keeps_the_case(tmp_path: Path) -> None:
    spec = json.loads((minilm_folder() / "tokenizer.json").read_text())
    tok = full_tokenizer(
        minilm_folder() / "tokenizer.json",
        {"normalizer": {**spec["normalizer"], "lowercase": False}},
    )
    twin = ascii_twin(tok)
    assert twin is not None and twin.rust.normalizer is None
    assert ids_of(tok, twin, ASCII_TEXTS) == reference(tok, ASCII_TEXTS)
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
    tok = full_tokenizer(minilm_folder() / "tokenizer.json", edit)
    assert ascii_twin(tok) is None
    assert ids_of(tok, None, ASCII_TEXTS) == reference(tok, ASCII_TEXTS)


@pytest.mark.parametrize("truncate", [False, "end", "start"])
@pytest.mark.parametrize("prompt", ["", "Query: "])
def test_text_tokenizer_ids_are_those_without_twins(truncate: bool | str, prompt: str) -> None:
    path = minilm_folder() / "tokenizer.json"
    ours = TextTokenizer(path, 12, window_chars=24)  # long texts read in pieces too
    whole = TextTokenizer(path, 12, window_chars=24)
    whole._twins = dict.fromkeys(whole._twins)  # every twin off
    assert any(ours._twins.values())
    texts = [*ASCII_TEXTS, *NOT_CLEAN, " ".join(ASCII_TEXTS * 3)]
    if not truncate:
        texts = [t for t in texts if len(whole.encode_plain(prompt + t)) <= 10]
    assert len(texts) > 100
    assert ours.encode(texts, truncate=truncate, prompt=prompt) == whole.encode(
        texts, truncate=truncate, prompt=prompt
    )


def random_ascii(seed: int, count: int) -> list[str]:
    """Texts of every clean ASCII character, words of 1 to 130 letters among them."""
    rnd = random.Random(seed)
    chars = [chr(c) for c in range(32, 127)] + ["\t", "\n", "\r"]
    out = []
    for _ in range(count):
        parts = [rnd.choice(chars) for _ in range(rnd.randint(0, 200))]
        parts.insert(rnd.randint(0, len(parts)), "x" * rnd.choice([1, 99, 100, 101, 130]))
        out.append("".join(parts))
    return out


def test_random_ascii_long_words_and_a_small_word_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Words over the 100-character limit become the unknown token as the tokenizer's do; a full
    word cache stops growing and changes nothing."""
    monkeypatch.setattr(twins, "CACHE_WORDS", 50)
    tok = full_tokenizer(minilm_folder() / "tokenizer.json")
    words: dict[str, tuple[int, ...]] = {}
    twin = ascii_twin(tok, words)
    texts = random_ascii(1, 400)
    assert all(twin.takes(t) for t in texts)
    assert twin.ids(texts) == reference(tok, texts)
    assert twin.ids(texts) == reference(tok, texts)  # again, from the cache
    assert len(words) <= 50


@pytest.mark.parametrize("direction", ["right", "left"])
def test_a_truncating_twin_keeps_the_tokenizers_end(direction: str) -> None:
    tok = full_tokenizer(minilm_folder() / "tokenizer.json")
    tok.enable_truncation(9, direction=direction)
    twin = ascii_twin(tok)
    texts = [*random_ascii(2, 200), "one", "two words here", ""]
    assert twin is not None
    assert twin.ids(texts) == reference(tok, texts)
    assert max(map(len, twin.ids(texts))) == 9


def test_a_large_batch_in_a_large_pool_goes_through_the_rust_twin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tok = full_tokenizer(minilm_folder() / "tokenizer.json")
    twin = ascii_twin(tok)
    assert twin is not None
    texts = [*ASCII_TEXTS, *NOT_CLEAN] * 3
    asked = []
    # a stand-in single thread that marks its ids
    monkeypatch.setattr(twin, "ids", lambda t: asked.append(t) or [[-1]] * len(t))
    monkeypatch.setenv(twins.TOKENIZER_POOL, str(twins.PARALLEL_THREADS))
    assert ids_of(tok, twin, texts) == reference(tok, texts)
    assert not asked  # the Rust twin's pool, not the single thread
    monkeypatch.setenv(twins.TOKENIZER_POOL, "1")
    assert [-1] in ids_of(tok, twin, texts)
    assert asked


def test_a_twin_that_disagrees_with_its_tokenizer_is_not_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check at making: a pre-tokenizing rule broken here means no twin, not wrong ids."""
    monkeypatch.setattr(twins, "_WORDS", twins.re.compile(r"\S+"))  # punctuation not split
    assert ascii_twin(full_tokenizer(minilm_folder() / "tokenizer.json")) is None
