"""The native tokenizer (`embedserve._native.Tokenizer`, the `tokenizers` crate) gives the Python
`tokenizers` package's ids, id for id, on every family we serve: BERT uncased (MiniLM), MPNet,
XLM-R, Gemma 3 and Qwen3, on text that exercises normalization, pre-tokenization and bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from embedserve._native import Tokenizer as NativeTokenizer
from embedserve.core.tokenization import TextTokenizer
from embedserve.devtools.tokenizer_sources import qwen3_tokenizer_dir, write_family_tokenizer

TEXTS = [
    "what is the capital of france",
    "A passage: Café déjà-vu, naïve coöperation — “quotes”, ‘single’ and «guillemets».",
    "Numbers 3.14159, 1,000,000 and 2026-12-06T04:41:59Z; e-mail: a.b+c@example.org",
    "中文文本，日本語のテキスト、한국어 텍스트 and Ελληνικά, русский текст",
    "emoji 🙂👍🏽 family 👨‍👩‍👧 flags 🇫🇷 zero\u200bwidth and\ttabs\nnewlines  double  spaces",
    "CamelCaseWords snake_case_words kebab-case-words HTML <b>bold</b> &amp; `code()`",
    "x" * 300,
    " leading and trailing spaces ",
    "Ünïcödé NFKC ﬁ ligature ① ² ＡＢＣ full-width",
]


def _family_tokenizer(kind: str, tmp: Path) -> Path:
    if kind == "qwen3":
        return qwen3_tokenizer_dir() / "tokenizer.json"
    write_family_tokenizer(tmp, kind, 512)
    return tmp / "tokenizer.json"


def _reference(kind: str, tmp: Path) -> tuple[Path, Tokenizer]:
    """The family's tokenizer.json and the Python package's tokenizer of it, whole texts."""
    try:
        path = _family_tokenizer(kind, tmp)
    except (OSError, ImportError, ModuleNotFoundError) as e:  # the extra's packages
        pytest.skip(f"{kind}'s tokenizer source is not installed: {e}")
    reference = Tokenizer.from_file(str(path))
    reference.no_padding()
    reference.no_truncation()
    return path, reference


@pytest.mark.parametrize("kind", ["bert-uncased", "mpnet", "xlm-roberta", "gemma3", "qwen3"])
def test_ids_equal_the_python_packages(kind: str, tmp_path: Path) -> None:
    path, reference = _reference(kind, tmp_path)
    native = NativeTokenizer(str(path))
    expected = [e.ids for e in reference.encode_batch(TEXTS)]
    for text, ids in zip(TEXTS, expected, strict=True):
        assert native.ids(text) == ids, text
    raw_ids, raw_cu = native.encode_packed(TEXTS)
    ids, cu = np.frombuffer(raw_ids, "<i4"), np.frombuffer(raw_cu, "<i4")
    assert cu.tolist() == np.cumsum([0] + [len(e) for e in expected]).tolist()
    assert ids.tolist() == [i for e in expected for i in e]


def test_a_text_over_the_limit_is_named(minilm_path: Path) -> None:
    native = NativeTokenizer(str(minilm_path / "tokenizer.json"), max_length=16)
    with pytest.raises(ValueError, match=r"input\[1\] has 22 tokens, over the model's limit of 16"):
        native.encode_packed(["short", "word " * 20])
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        NativeTokenizer(str(minilm_path / "config.json"))


@pytest.mark.parametrize("kind", ["bert-uncased", "mpnet", "xlm-roberta", "gemma3", "qwen3"])
def test_plain_ids_and_pairs_equal_the_python_packages(kind: str, tmp_path: Path) -> None:
    """The request core's native plain ids (no special tokens) and its pairs joined by the
    tokenizer's pair template (`embedserve._native.PairTemplate`) are the package's, special
    tokens written in the text included."""
    path, reference = _reference(kind, tmp_path)
    ours = TextTokenizer(path, 512)
    texts = [*TEXTS, "specials [SEP] [CLS] </s> <s> <pad> <bos> <|im_end|> in the text"]
    plain = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
    assert ours.encode_plain_batch(texts) == plain
    assert ours.encode_plain(texts[1]) == plain[1]
    template = ours.pair_template
    assert template is not None
    for query, q in zip(texts[:3], plain[:3], strict=True):
        batch = ours.pairs(query, texts, 512, None)  # the request core's: tokenized and joined
        assert batch is not None
        for pair, d, got in zip(
            reference.encode_batch([(query, t) for t in texts]), plain, batch, strict=True
        ):
            assert got == (("pair", pair.ids, got[2]) if d else ("empty", [], 0)), (query, d)
            joined, ids, second = template.join(q, d, 512)
            assert joined == "pair" and ids == pair.ids, (query, d)
            head = template.before + q + template.between
            assert ids == head + d + template.after and second == len(head)
            if d:  # the document's first token: where token type 1 begins
                assert pair.sequence_ids.index(1) == second


@pytest.mark.parametrize("kind", ["bert-uncased", "xlm-roberta"])
def test_a_cut_pair_equals_the_packages_truncation_of_its_second_text(
    kind: str, tmp_path: Path
) -> None:
    """`PairTemplate.join`'s cut (native/src/ivy/pairs.rs) keeps the document's beginning
    ("end") or its end ("start") as the package's `only_second` truncation does; the query is
    never cut, and a pair over the limit without a cut is refused with its length."""
    path, reference = _reference(kind, tmp_path)
    ours = TextTokenizer(path, 512)
    template = ours.pair_template
    assert template is not None
    query, doc = TEXTS[0], " ".join(TEXTS) * 3
    q, d = ours.encode_plain(query), ours.encode_plain(doc)
    limit = len(template.before + q + template.between + template.after) + len(d) // 2
    for truncate, direction in (("end", "right"), ("start", "left")):
        reference.enable_truncation(limit, strategy="only_second", direction=direction)
        joined, ids, _ = template.join(q, d, limit, truncate)
        assert joined == "pair" and ids == reference.encode(query, doc).ids, truncate
    assert template.join(q, d, limit) == ("too_long", [], limit + len(d) - len(d) // 2)
    fixed = len(template.before + q + template.between + template.after)
    assert template.join(q, d, fixed, "end") == ("query_too_long", [], fixed)
