"""Prompts as the request core resolves them: the folder's query/document templates, a named
prompt, a literal prompt, Qwen3's instruction format, and the conflicts between them."""

from __future__ import annotations

import pytest

from embedserve.core.inputs import INSTRUCTION_TEMPLATE
from embedserve.errors import InputError, InputTypeError
from tests.core.request_core import PROMPTS, minilm_spec, preparer


def test_minilm_declares_no_prompts_so_every_template_is_empty() -> None:
    core = preparer()
    assert minilm_spec().prompts == {} and minilm_spec().default_prompt_name is None
    assert core.prompt() == ""
    assert core.prompt(input_type="query") == ""
    assert core.prompt(input_type="document") == ""


def test_input_type_picks_the_folders_template_and_prefixes_the_tokens() -> None:
    core = preparer(prompts=PROMPTS)
    assert core.prompt(input_type="query") == "query: "
    assert core.prompt(input_type="document") == "passage: "
    query = core.prepare("hello world", core.options(input_type="query"))
    plain = core.prepare("hello world")
    # [CLS] query : hello world [SEP], against [CLS] hello world [SEP]
    assert query.seqs == [[101, 23032, 1024, 7592, 2088, 102]]
    assert plain.seqs == [[101, 7592, 2088, 102]]
    assert query.single and plain.single


def test_prompt_name_a_literal_prompt_and_the_folders_default() -> None:
    core = preparer(prompts=PROMPTS)
    assert core.prompt(prompt_name="title") == "title: "
    assert core.prompt(prompt="search: ") == "search: "
    assert core.options(prompt_name="title").prompt == "title: "
    defaulted = preparer(prompts=PROMPTS, default_prompt_name="document")
    assert defaulted.prompt() == "passage: "  # nothing asked: the folder's default
    assert defaulted.prompt(prompt="") == ""  # an explicit empty prompt wins over it


# a folder whose query prompt is in Qwen3-Embedding's instruction format
QWEN3_PROMPTS = {**PROMPTS, "query": "Instruct: Given a web search query\nQuery:"}


def test_one_rule_on_a_model_without_prompts() -> None:
    """all-MiniLM-L6-v2: `instruction` and `prompt_name` are errors naming the option,
    `input_type` adds nothing (Cohere's clients always send one)."""
    core = preparer()
    with pytest.raises(InputError, match="no instruction template") as caught:
        core.options(instruction="Find the answer")
    assert caught.value.param == "instruction"
    with pytest.raises(InputError, match="this model has no prompts") as caught:
        core.options(prompt_name="query")
    assert caught.value.param == "prompt_name"
    plain = core.prepare("hello world").seqs
    for kind in ("query", "document"):
        assert core.prepare("hello world", core.options(input_type=kind)).seqs == plain
    # a folder with prompts but none in the instruction format refuses an instruction too
    with pytest.raises(InputError, match="no instruction template"):
        preparer(prompts=PROMPTS).options(instruction="x")


def test_instruction_is_qwen3s_query_format_with_or_without_input_type_query() -> None:
    core = preparer(prompts=QWEN3_PROMPTS)
    expected = "Instruct: Find the answer\nQuery:"
    assert INSTRUCTION_TEMPLATE.format(instruction="Find the answer") == expected
    assert core.prompt(instruction="Find the answer") == expected
    # the instruction replaces the folder's query template, it does not add to it
    assert core.prompt(input_type="query", instruction="Find the answer") == expected


@pytest.mark.parametrize(
    ("kwargs", "error", "param", "message"),
    [
        ({"prompt": "a", "prompt_name": "title"}, InputError, "prompt_name", "pass only one"),
        ({"prompt_name": "title", "input_type": "query"}, InputError, "input_type", "only one"),
        ({"input_type": "document", "instruction": "x"}, InputError, "instruction", "queries"),
        ({"instruction": "  "}, InputError, "instruction", "non-empty"),
        ({"input_type": "passage"}, InputError, "input_type", '"query" or "document"'),
        ({"prompt_name": "nope"}, InputError, "prompt_name", "prompts: document, query, title"),
        ({"prompt": 3}, InputTypeError, "prompt", "prompt must be a string, got int"),
    ],
)
def test_bad_prompt_options_name_their_parameter(
    kwargs: dict[str, object], error: type[InputError], param: str, message: str
) -> None:
    core = preparer(prompts=QWEN3_PROMPTS)
    with pytest.raises(error, match=message) as caught:
        core.options(**kwargs)  # type: ignore[arg-type]
    assert caught.value.param == param


def test_conflicts_are_coded_as_such() -> None:
    core = preparer(prompts=PROMPTS)
    with pytest.raises(InputError) as caught:
        core.prompt(prompt="a", input_type="query")
    assert caught.value.code == "conflict"
