"""A reranker refuses a query or document with no token of its own after the tokenizer's
normalization ("\u0000", control characters, whitespace for WordPiece) as it refuses "", as the
embedding path does (tests/core/test_empty_texts.py): the error names the field the caller sent
and the index. A cross-encoder's "\u0000" document was a 400 saying the tokenizer has no pair
template, and a "\u0000" query was scored as if empty (issue 40 item 7)."""

from __future__ import annotations

import dataclasses

import pytest

from embedserve.core.pairs import Fields, PairPreparer
from embedserve.core.tokenization import TextTokenizer
from embedserve.errors import InputError
from embedserve.loading.spec import ScoreSpec
from tests.core.request_core import minilm_folder, minilm_spec
from tests.core.test_empty_texts import EMPTY_AFTER_NORMALIZATION

QUERY = "what is a vector database"
KINDS = {
    # MiniLM's WordPiece and pair template are ms-marco-MiniLM's (a cross-encoder's)
    "cross-encoder": ScoreSpec("classifier", "sigmoid"),
    # the LLM reranker's prompt around a tokenizer that drops characters (Qwen's keeps them)
    "llm-reranker": ScoreSpec("yes_no", "identity", (2748, 2053)),
}
EMPTY = r"is (an )?empty"  # "" and "   " are refused as read, the others once tokenized


def pairs(kind: str, max_length: int = 256) -> PairPreparer:
    spec = dataclasses.replace(minilm_spec(), score=KINDS[kind], max_seq_length=max_length)
    return PairPreparer(spec, TextTokenizer(minilm_folder() / "tokenizer.json", max_length))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("text", EMPTY_AFTER_NORMALIZATION)
@pytest.mark.parametrize("truncate", [False, "end", "start"])
def test_a_pair_with_no_token_of_its_own_is_refused_naming_the_field(
    kind: str, text: str, truncate: object
) -> None:
    core = pairs(kind)
    for query, docs, param, where in (
        (QUERY, ["a document", text], "documents", r"documents\[1\]"),
        (text, ["a document"], "query", "query"),
    ):
        with pytest.raises(InputError) as caught:
            core.prepare(query, docs, truncate=truncate)
        assert (caught.value.param, caught.value.code) == (param, "invalid_value")
        assert caught.value.message.startswith(where.replace("\\", "")), caught.value.message
        with pytest.raises(InputError, match=f"^{where} {EMPTY}"):
            core.prepare(query, docs, truncate=truncate)
    # TEI's /rerank sends `texts`: the error names them
    with pytest.raises(InputError, match=rf"^texts\[2\] {EMPTY}") as caught:
        core.prepare(QUERY, ["a", "b", text], fields=Fields("query", "texts"))
    assert caught.value.param == "texts"


@pytest.mark.parametrize("kind", list(KINDS))
def test_pairs_with_tokens_of_their_own_are_prepared(kind: str) -> None:
    core = pairs(kind)
    # "a" merges into nothing, but a short document next to the prompt must not be mistaken
    # for none: each gives at least one token of its own
    docs = ["a", "\u0000a", " . ", "é", "!", "x" * 3000]
    prepared = core.prepare("\u0000q", docs, truncate="end")
    assert len(prepared.seqs) == len(docs)
    assert prepared.seqs[0] != core.prepare("\u0000q", ["b"]).seqs[0]  # "a"'s token is there


def test_a_classifier_pair_names_the_text_of_the_input() -> None:
    """A classifier's `[a, b]` pair goes through the same pairs: its error names `inputs[i][j]`."""
    from embedserve.core.classify import ClassifyPreparer
    from embedserve.loading.labels import LabelSpec

    spec = dataclasses.replace(minilm_spec(), labels=LabelSpec(("no", "yes"), "softmax"))
    core = ClassifyPreparer(spec, TextTokenizer(minilm_folder() / "tokenizer.json", 256))
    for pair, where in (
        (["a", "\u0000"], r"inputs\[1\]\[1\]"),
        (["\u0000", "b"], r"inputs\[1\]\[0\]"),
    ):
        with pytest.raises(InputError, match=f"^{where} is empty after") as caught:
            core.prepare(["a text", pair])
        assert caught.value.param == "inputs"
    assert len(core.prepare(["a text", ["a", "b"]]).seqs) == 2
