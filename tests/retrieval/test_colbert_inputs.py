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


def test_a_long_document_is_cut_at_the_folders_document_length(retrieval_folder: Any) -> None:
    """Faults IV: PyLate cuts documents at `document_length` (how the model was trained); a
    longer one was a 400 whose advice (truncate "chunk") was refused too."""
    folder = retrieval_folder("answerai-colbert-small-v1")
    spec = read_model_spec(folder)
    assert spec.retrieval is not None and spec.retrieval.colbert is not None
    colbert = ColbertInputs(spec.retrieval.colbert, folder / "tokenizer.json")
    length = spec.retrieval.colbert.document_length
    long_doc = " ".join(f"word{i}" for i in range(3 * length))
    for truncate in (False, "end", "start"):
        seqs = colbert.prepare([long_doc, "short"], query=False, truncate=truncate).seqs  # type: ignore[arg-type]
        assert len(seqs[0]) == length and len(seqs[1]) < length
    kept_end = colbert.prepare([long_doc], query=False, truncate="start").seqs[0]
    assert kept_end != colbert.prepare([long_doc], query=False, truncate=False).seqs[0]
