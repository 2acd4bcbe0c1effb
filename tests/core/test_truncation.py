"""Truncation sides: an over-long input is an error by default, keeps its beginning with
truncate="end" and its end with truncate="start", special tokens kept either way."""

from __future__ import annotations

import pytest

from embedserve.errors import InputError, InputTooLong
from tests.core.request_core import TEXT, WORDS, preparer


def test_an_over_long_input_is_an_error_naming_its_length_and_the_limit() -> None:
    core = preparer(max_seq_length=12)
    with pytest.raises(InputTooLong) as caught:
        core.prepare(TEXT)
    assert (caught.value.num_tokens, caught.value.max_length) == (16, 12)
    with pytest.raises(InputTooLong) as caught:
        core.prepare(["short", TEXT])
    assert caught.value.where == "input[1]"


def test_end_keeps_the_beginning_and_start_keeps_the_end() -> None:
    core = preparer(max_seq_length=12)
    end = core.prepare(TEXT, core.options(truncate="end")).seqs
    start = core.prepare(TEXT, core.options(truncate="start")).seqs
    assert end == [[101, *WORDS[:10], 102]]
    assert start == [[101, *WORDS[-10:], 102]]


def test_inputs_within_the_limit_are_left_whole_on_either_side() -> None:
    core = preparer(max_seq_length=12)
    for side in ("end", "start"):
        assert core.prepare(["one two"], core.options(truncate=side)).seqs == [
            [101, 2028, 2048, 102]
        ]


def test_token_id_inputs_are_cut_the_same_way() -> None:
    core = preparer(max_seq_length=4)
    ids = [5, 6, 7, 8, 9, 10]
    assert core.prepare(ids, core.options(truncate="end")).seqs == [[5, 6, 7, 8]]
    assert core.prepare([ids], core.options(truncate="start")).seqs == [[7, 8, 9, 10]]
    with pytest.raises(InputTooLong):
        core.prepare(ids)


def test_truncate_none_is_false_and_other_values_are_refused() -> None:
    core = preparer()
    assert core.options(truncate=None).truncate is False
    with pytest.raises(InputError, match='truncate must be false, "end", "start" or "chunk"'):
        core.options(truncate="middle")
