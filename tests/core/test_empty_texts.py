"""A text with no token of its own after the tokenizer's normalization ("\u0000", control
characters, whitespace for MiniLM's WordPiece) is refused as "" is, with the same 400: it would
be embedded as the empty text (issue 40 item 7). A prompt does not hide it, and a text whose
tokens merge into the prompt's is not mistaken for one."""

from __future__ import annotations

import pytest

from embedserve.errors import InputError
from tests.core.request_core import PROMPTS, preparer

EMPTY_AFTER_NORMALIZATION = ["\u0000", "\u0000\u0000\u0000", "   ", "\t\n", "\u200b", "\x01 \x7f"]


@pytest.mark.parametrize("text", EMPTY_AFTER_NORMALIZATION)
@pytest.mark.parametrize("truncate", [False, "end", "start", "chunk"])
def test_a_text_with_no_token_of_its_own_is_refused_as_the_empty_string(
    text: str, truncate: object
) -> None:
    core = preparer()
    with pytest.raises(InputError) as empty:
        core.prepare("")
    for value, where in ((text, "input"), (["a text", text], "input[1]")):
        with pytest.raises(InputError) as caught:
            core.prepare(value, core.options(truncate=truncate))
        # the same class, parameter and code: the gateway answers both with the same 400
        assert type(caught.value) is type(empty.value)
        assert (caught.value.param, caught.value.code) == (empty.value.param, empty.value.code)
        assert caught.value.message.startswith(f"{where} is empty after the tokenizer's")


def test_a_prompt_does_not_hide_an_empty_text() -> None:
    core = preparer(prompts=PROMPTS)
    with pytest.raises(InputError, match="input is empty after"):
        core.prepare("\u0000", core.options(prompt_name="query"))
    with pytest.raises(InputError, match="input is empty after"):
        core.prepare("\u0000" * 5000, core.options(prompt_name="query"))


def test_texts_with_tokens_are_embedded() -> None:
    core = preparer(prompts=PROMPTS)
    for text in ("a", "\u0000a", " . ", "é", "!"):
        assert len(core.prepare(text).seqs[0]) > 2
        assert len(core.prepare(text, core.options(prompt_name="query")).seqs[0]) > 4
    # a text that merges into the prompt's last token is checked alone, not refused
    merged = preparer(prompts={"query": "un"})
    assert merged.prepare("able", merged.options(prompt_name="query")).seqs == [[101, 4039, 102]]
