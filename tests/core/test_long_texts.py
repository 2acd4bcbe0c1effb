"""A long text is tokenized a piece at a time (`core.tokenization`), with exactly the ids of the
whole text: compared here to whole-text tokenization for many texts cut at many lengths, with
pieces small enough that every cut falls somewhere new, on the bundled MiniLM tokenizer and the
real Qwen3 one."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from embedserve.core.tokenization import TextTokenizer
from embedserve.errors import InputTooLong
from tests.data.texts import EMOJI, MULTILINGUAL, QUERIES, passages

HOSTILE = [
    "x" * 3000,  # no whitespace at all
    "ab" * 700 + "." * 500,
    "word" + " " * 900 + "word " * 40 + " " * 300 + "end",  # long runs of spaces
    "😀" * 400 + " 👍🏽 " * 100 + "🇫🇷" * 50,  # emoji, skin tones, flags
    "line\n\n\n  \r\n" * 120,
    "it's they're I'll " * 60 + "1234567890" * 40,
    "東京は日本の首都です。" * 60,
    "a<|endoftext|>b [SEP] [MASK]c<|im_start|>" * 40,  # added tokens in the text
    "Ünïcödé naïve café e\u0301 " * 80,  # combining accents (NFC)
]
CORPUS = [
    " ".join(passages()[:3]),
    " ".join(EMOJI) * 3,
    " ".join(MULTILINGUAL) * 4,
    " ".join(QUERIES) * 3,
    *HOSTILE,
]


def _qwen3_tokenizer(folder: Path) -> Path:
    checkpoints = pytest.importorskip("embedserve.devtools.checkpoints")
    try:
        checkpoints.write_tokenizer(folder, append_eos=True)  # Qwen3-Embedding's template
    except ValueError as e:  # the package that ships the Qwen3 files is not installed
        pytest.skip(str(e))
    return folder / "tokenizer.json"


@pytest.fixture(params=["minilm", "qwen3"])
def tokenizer_file(request: pytest.FixtureRequest, minilm_path: Path, tmp_path: Path) -> Path:
    if request.param == "minilm":
        return minilm_path / "tokenizer.json"
    return _qwen3_tokenizer(tmp_path)


def _whole(path: Path, max_length: int) -> dict[object, Tokenizer]:
    """The reference: whole texts through tokenizers' own truncation."""
    out: dict[object, Tokenizer] = {}
    for cut, direction in ((False, None), ("end", "right"), ("start", "left")):
        tok = Tokenizer.from_file(str(path))
        tok.no_padding()
        if direction is None:
            tok.no_truncation()
        else:
            tok.enable_truncation(max_length, direction=direction)
        out[cut] = tok
    return out


@pytest.mark.parametrize("max_length", [8, 40])
def test_pieces_give_the_whole_texts_ids(tokenizer_file: Path, max_length: int) -> None:
    reference = _whole(tokenizer_file, max_length)
    for window in (5, 33):
        ours = TextTokenizer(tokenizer_file, max_length, window_chars=window)
        assert ours.whole_chars == window  # every text below is cut in pieces
        for text in CORPUS:
            for length in range(window + 1, min(len(text), 1200), 41):
                cut = text[:length]
                for truncate in ("end", "start"):
                    expected = reference[truncate].encode(cut).ids
                    assert ours.encode([cut], truncate=truncate)[0] == expected, (
                        window,
                        truncate,
                        cut,
                    )
                whole = reference[False].encode(cut).ids
                if len(whole) <= max_length:
                    assert ours.encode([cut]) == [whole], (window, cut)
                else:
                    with pytest.raises(InputTooLong):
                        ours.encode([cut])


def test_an_over_long_text_is_told_its_size(minilm_path: Path) -> None:
    tok = TextTokenizer(minilm_path / "tokenizer.json", 256)
    with pytest.raises(InputTooLong, match=r"input\[0\] has 402 tokens, over"):
        tok.encode(["word " * 400])  # short enough to count whole: the exact count
    with pytest.raises(InputTooLong, match=r"input\[1\] has more than \d+ tokens \(500000 "):
        tok.encode(["short", "word " * 100_000])
