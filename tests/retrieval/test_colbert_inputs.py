"""A ColBERT request's values are checked as every model's are: an empty list, an empty text or
a wrong type is a 400 (an empty list was a 500 with a traceback, issue 40 item 14)."""

from __future__ import annotations

from typing import Any

import pytest

from embedserve.core.inputs import InputPreparer
from embedserve.core.tokenization import TextTokenizer
from embedserve.errors import InputError
from embedserve.loading.spec import read_model_spec
from embedserve.retrieval.inputs import ColbertInputs, prepare_outputs


@pytest.mark.parametrize("value", [[], "", [""], ["a", 3], 7, [[101, 102]], "\u0000", ["a", " "]])
def test_bad_colbert_inputs_are_input_errors(retrieval_folder: Any, value: Any) -> None:
    folder = retrieval_folder("answerai-colbert-small-v1")
    spec = read_model_spec(folder)
    inputs = InputPreparer(spec, TextTokenizer(folder / "tokenizer.json", spec.max_seq_length))
    assert spec.retrieval is not None and spec.retrieval.colbert is not None
    colbert = ColbertInputs(spec.retrieval.colbert, folder / "tokenizer.json")
    with pytest.raises(InputError):
        prepare_outputs(inputs, colbert, value)
    with pytest.raises(InputError):
        prepare_outputs(inputs, colbert, value, input_type="query")
    assert len(prepare_outputs(inputs, colbert, ["a text"]).seqs) == 1
