"""ColBERT's (PyLate's) sequences: the marker token after CLS, queries cut to the query length
and filled up to it with the mask token (query expansion), documents cut to the document length.

PyLate tokenizes with a limit one below the length (the marker is inserted after tokenizing), so
do we. A query is always cut and expanded to exactly `query_length` tokens (that is the model's
query); a document over `document_length` is cut there too, keeping its beginning (PyLate's
rule, how the model was trained: a 206-token document to a 179-token model was a 400 whose
advice, truncate "chunk", was refused as well), or its end with `truncate="start"`.
With `attend_to_expansion_tokens` off, the expansion tokens attend to the query but nothing
attends to them: `visible` says how many leading tokens of each sequence are attended to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedserve.core.inputs import InputPreparer, refuse_empty
from embedserve.core.tokenization import Cut, TextTokenizer
from embedserve.errors import InputError
from embedserve.loading.retrieval import ColbertSpec


@dataclass(frozen=True)
class ColbertSequences:
    seqs: list[list[int]]
    visible: tuple[int, ...] | None  # per sequence, its attended leading tokens (None: all)
    vectors: list[int]  # the vectors each will give (a document drops its skip-list tokens)


class ColbertInputs:
    def __init__(self, spec: ColbertSpec, tokenizer_path: Path) -> None:
        self.spec = spec
        marker = 1 if spec.query_prefix_id is not None else 0
        self.query_tokens = TextTokenizer(tokenizer_path, spec.query_length - marker)
        marker = 1 if spec.document_prefix_id is not None else 0
        self.document_tokens = TextTokenizer(tokenizer_path, spec.document_length - marker)

    def prepare(self, texts: Sequence[str], *, query: bool, truncate: Cut) -> ColbertSequences:
        if not all(isinstance(t, str) for t in texts):
            raise InputError("a ColBERT model takes texts (strings), not token ids")
        spec = self.spec
        tokens = self.query_tokens if query else self.document_tokens
        cut: Cut = "start" if truncate == "start" and not query else "end"
        ids = tokens.encode(texts, truncate=cut)
        refuse_empty(tokens, texts, ids)  # the markers alone are no text either
        marker = spec.query_prefix_id if query else spec.document_prefix_id
        seqs = [[*s[:1], marker, *s[1:]] if marker is not None else list(s) for s in ids]
        if not query:
            skip = set(spec.skiplist_ids)
            return ColbertSequences(seqs, None, [sum(t not in skip for t in s) for s in seqs])
        if not spec.expansion:
            return ColbertSequences(seqs, None, [len(s) for s in seqs])
        real = [len(s) for s in seqs]
        seqs = [s + [spec.mask_id] * (spec.query_length - len(s)) for s in seqs]
        visible = None if spec.attend_to_expansion else tuple(real)
        return ColbertSequences(seqs, visible, [len(s) for s in seqs])


@dataclass(frozen=True)
class OutputSequences:
    """The sequences of one encode of a sparse or multi-vector model, as every front end (the
    offline `Embedder`, the gateway) prepares them."""

    seqs: list[list[int]]
    visible: tuple[int, ...] | None  # per sequence, its attended leading tokens (None: all)
    vectors: list[int]  # per sequence, the multi-vector rows it gives
    query: bool  # query-side (ColBERT: every token kept, the expansion included)


def prepare_outputs(
    inputs: InputPreparer,
    colbert: ColbertInputs | None,
    texts: Any,
    *,
    input_type: Any = None,
    prompt_name: Any = None,
    prompt: Any = None,
    truncate: Any = False,
) -> OutputSequences:
    """ColBERT: markers, query expansion and the document length (`input_type` "query" or
    "document", the default); other models: the request core's prompts and truncation, every
    token after CLS a multi-vector row (bge-m3). `truncate="chunk"` is refused: it averages
    windows, which only a dense output can."""
    query = input_type == "query"
    if colbert is not None:
        if input_type not in (None, "query", "document"):
            raise InputError(
                f'input_type must be "query" or "document"; got {input_type!r}',
                param="input_type",
            )
        if prompt_name is not None or prompt is not None:
            raise InputError("a ColBERT model takes no prompt: its markers", param="prompt")
        cut = inputs.options(truncate=truncate).truncate
        if cut == "chunk":
            raise InputError(CHUNK_DENSE_ONLY, param="truncate")
        # the request core's checks of the values (an empty list or text, a wrong type) first:
        # an empty list reached the model and failed there (a 500)
        read, ids = inputs.read_inputs(texts)
        if read is None or ids is not None:
            raise InputError("a ColBERT model takes texts (strings), not token ids")
        out = colbert.prepare(read, query=query, truncate=cut)
        return OutputSequences(out.seqs, out.visible, out.vectors, query)
    options = inputs.options(
        prompt_name=prompt_name, prompt=prompt, input_type=input_type, truncate=truncate
    )
    if options.truncate == "chunk":
        raise InputError(CHUNK_DENSE_ONLY, param="truncate")
    seqs = inputs.prepare([texts] if isinstance(texts, str) else texts, options).seqs
    return OutputSequences(seqs, None, [len(s) - 1 for s in seqs], query)


CHUNK_DENSE_ONLY = 'truncate="chunk" averages windows: dense outputs only'
