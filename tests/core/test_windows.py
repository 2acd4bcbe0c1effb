"""truncate="chunk": an over-long input cut into windows that each keep the special tokens and
the prompt, averaged back by content tokens; late chunking's chunk spans; and the token-budget
groups those sequences are sent in."""

from __future__ import annotations

import numpy as np

from embedserve.core.budget import budget_groups, split_rows
from embedserve.core.chunking import packed_spans
from tests.core.request_core import PROMPTS, TEXT, WORDS, preparer


def test_an_over_long_text_becomes_windows_weighted_by_their_content() -> None:
    core = preparer(max_seq_length=12)
    prepared = core.prepare([TEXT, "hi"], core.options(truncate="chunk"))
    assert prepared.seqs == [
        [101, *WORDS[:10], 102],
        [101, *WORDS[10:], 102],
        [101, 7632, 102],  # within the limit: one sequence, as truncate=False would send it
    ]
    assert prepared.windows_per_input == [2, 1]
    assert prepared.window_weights == [10, 4, 1]


def test_every_window_repeats_the_prompt_which_is_not_content() -> None:
    core = preparer(max_seq_length=12, prompts=PROMPTS)
    prepared = core.prepare([TEXT], core.options(truncate="chunk", input_type="query"))
    query = [23032, 1024]  # "query:"
    assert prepared.seqs == [[101, *query, *WORDS[:8], 102], [101, *query, *WORDS[8:], 102]]
    assert prepared.window_weights == [8, 6]


def test_windows_are_averaged_back_into_one_row_per_input() -> None:
    core = preparer(max_seq_length=12)
    prepared = core.prepare([TEXT, "hi"], core.options(truncate="chunk"))
    pooled = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0]], dtype=np.float32)
    combined = prepared.combine(pooled)
    np.testing.assert_allclose(combined, [[10 / 14, 4 / 14], [3.0, 3.0]], rtol=1e-6)
    assert combined.dtype == np.float32


def test_token_ids_are_cut_into_plain_windows() -> None:
    core = preparer(max_seq_length=12)
    prepared = core.prepare(list(range(100, 130)), core.options(truncate="chunk"))
    assert prepared.seqs == [list(range(100, 112)), list(range(112, 124)), list(range(124, 130))]
    assert prepared.windows_per_input == [3] and prepared.window_weights == [12, 12, 6]
    assert prepared.single


def test_late_chunking_spans_are_each_chunks_tokens_in_the_joined_document() -> None:
    core = preparer()
    plans = core.plan_documents([["hello world", "good morning"], ["one"]])
    assert plans[0].ids == [101, 7592, 2088, 2204, 2851, 102]
    assert plans[0].spans == [(1, 3), (3, 5)]
    assert (plans[1].ids, plans[1].spans) == ([101, 2028, 102], [(1, 2)])
    # packed back to back, the second document's span moves past the first's six tokens
    assert packed_spans(plans).tolist() == [[1, 3], [3, 5], [7, 8]]
    (joined,) = core.plan_documents([["a", "b"]], separator=" | ")
    assert joined.ids == [101, 1037, 1064, 1038, 102] and joined.spans == [(1, 2), (3, 4)]


def test_windows_go_out_in_budget_groups_and_come_back_per_input() -> None:
    core = preparer(max_seq_length=12)
    prepared = core.prepare([TEXT, "hi", TEXT], core.options(truncate="chunk"))
    sizes = [len(s) for s in prepared.seqs]
    assert sizes == [12, 6, 3, 12, 6]
    groups = [list(r) for r in budget_groups(sizes, 20)]
    assert groups == [[0, 1], [2, 3], [4]]
    assert sum(sizes[i] for i in groups[1]) == 15
    rows = np.arange(10, dtype=np.float32).reshape(5, 2)
    per_input = split_rows(rows, prepared.windows_per_input or [])
    assert [p.shape[0] for p in per_input] == [2, 1, 2]
    np.testing.assert_array_equal(per_input[2], rows[3:])
