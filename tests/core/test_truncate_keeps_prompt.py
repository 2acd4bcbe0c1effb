"""`truncate: "start"` keeps the end of the text and the prompt: the Qwen3 instruction or a
`query: ` prefix is what a caller asked for, and cutting the start of `prompt + text` dropped
it silently (issue 24, item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedserve.core.inputs import INSTRUCTION_TEMPLATE, InputOptions, InputPreparer
from embedserve.core.tokenization import TextTokenizer
from embedserve.errors import InputError
from embedserve.loading.spec import read_model_spec
from tests.core.test_long_texts import _qwen3_tokenizer

LONG = " ".join(f"word{i}" for i in range(600))


@pytest.fixture(scope="module")
def minilm_inputs(minilm_path: Path) -> InputPreparer:
    spec = read_model_spec(minilm_path)
    return InputPreparer(spec, TextTokenizer(minilm_path / "tokenizer.json", spec.max_seq_length))


def test_start_keeps_a_query_prefix(minilm_inputs: InputPreparer) -> None:
    tok = minilm_inputs.tokenizer
    [seq] = minilm_inputs.prepare([LONG], InputOptions("query: ", "start")).seqs
    prompt, text = tok.encode_plain("query: "), tok.encode_plain(LONG)
    cls, sep = tok.encode(["a"])[0][0], tok.encode(["a"])[0][-1]
    assert len(seq) == 256
    assert seq == [cls, *prompt, *text[-(256 - 2 - len(prompt)) :], sep]
    # the end of the text, as without a prompt
    [plain] = minilm_inputs.prepare([LONG], InputOptions("", "start")).seqs
    assert seq[-50:] == plain[-50:]


def test_start_keeps_the_qwen3_instruction(tmp_path: Path) -> None:
    tok = TextTokenizer(_qwen3_tokenizer(tmp_path), 64)
    prompt = INSTRUCTION_TEMPLATE.format(instruction="Given a web search query, find passages")
    [seq] = tok.encode([LONG], truncate="start", prompt=prompt)
    prompt_ids, eos = tok.encode_plain(prompt), tok.encode(["a"])[0][-1]
    assert len(seq) == 64 and seq[: len(prompt_ids)] == prompt_ids and seq[-1] == eos
    assert seq[len(prompt_ids) : -1] == tok.encode_plain(LONG)[-(63 - len(prompt_ids)) :]


def test_start_under_the_limit_is_the_prompted_text(minilm_inputs: InputPreparer) -> None:
    short = "a short text"
    [seq] = minilm_inputs.prepare([short], InputOptions("query: ", "start")).seqs
    assert seq == minilm_inputs.tokenizer.encode(["query: " + short])[0]


def test_a_prompt_that_leaves_no_room_is_an_error(minilm_path: Path) -> None:
    tok = TextTokenizer(minilm_path / "tokenizer.json", 8)
    with pytest.raises(InputError, match="no room is left") as error:
        tok.encode([LONG], truncate="start", prompt="a prompt of many more words than fit")
    assert error.value.param == "prompt"


def test_a_prompt_that_leaves_no_window_is_a_400_naming_it(minilm_path: Path) -> None:
    """It was a plain ValueError: a 500 from the gateway (issue 24, item 14)."""
    spec = read_model_spec(minilm_path)
    inputs = InputPreparer(spec, TextTokenizer(minilm_path / "tokenizer.json", 256))
    with pytest.raises(InputError, match='no room is left for the text truncate "chunk"') as e:
        inputs.prepare([LONG], InputOptions("many words " * 200, "chunk"))
    assert e.value.param == "prompt" and e.value.code == "context_length_exceeded"
