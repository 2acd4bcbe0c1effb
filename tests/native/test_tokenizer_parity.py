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
    tokenizer's pair template (`core.tokenization.PairTemplate`) are the package's, special
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
        for pair, d in zip(reference.encode_batch([(query, t) for t in texts]), plain, strict=True):
            head = template.before + q + template.between
            assert head + d + template.after == pair.ids, (query, d)
            if d:  # the document's first token: where token type 1 begins
                assert pair.sequence_ids.index(1) == len(head)
