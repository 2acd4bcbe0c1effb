"""The request core for sequence classification (task "classify"): inputs to checked sequences.

An input is a text (`[CLS] text [SEP]`, through `inputs.InputPreparer` as an embedding's text,
with no prompt) or a pair of texts `[a, b]` (the tokenizer's pair template, as a cross-encoder
pairs a query with a document, `pairs.PairPreparer`: an over-long pair cuts its second text).
`truncate`: false (an over-long input is an error), true or "end" (keep the beginning), "start"
(keep the end); late-chunking windows ("chunk") do not apply to a classifier.

Every front end (`scorer.Classifier`, the gateway's `/predict` and `/classify`) goes through
`ClassifyPreparer`, then `labels.LabelSpec.activate` turns the model's logits into scores.
No torch: the gateway runs this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.core.inputs import InputPreparer
from embedserve.core.pairs import Fields, PairPreparer
from embedserve.core.tokenization import TextTokenizer
from embedserve.errors import InputError, InputTypeError, shown
from embedserve.loading.labels import LabelSpec
from embedserve.loading.spec import ModelSpec


@dataclass(frozen=True)
class PreparedClassify:
    """One token sequence per input, in input order."""

    seqs: list[list[int]]
    second_segment: list[int]  # per sequence, where token type 1 begins (a pair); 0: none
    single: bool  # the caller passed one text, not a list


@dataclass(frozen=True)
class Prediction:
    """One label's score for one input."""

    label: str
    score: float


class ClassifyPreparer:
    """One classifier's request core: its inputs, their truncation, and its labels."""

    def __init__(self, spec: ModelSpec, tokenizer: TextTokenizer) -> None:
        if spec.labels is None:
            raise ValueError(f"{spec.path}: not a sequence classifier")
        self.labels: LabelSpec = spec.labels
        self.inputs = InputPreparer(spec, tokenizer)
        self.pairs = PairPreparer(spec, tokenizer)

    def prepare(self, inputs: Any, *, truncate: Any = False) -> PreparedClassify:
        """Checked sequences for a text, or a list whose items are texts or pairs of texts
        (`[a, b]` or `(a, b)`). NOTE: TEI reads a top-level list of two strings as one pair;
        its route says so before calling this (`gateway.classify`)."""
        cut = _truncate(truncate)
        single = isinstance(inputs, str)
        items = [inputs] if single else inputs
        if not isinstance(items, (list, tuple)) or not items:
            raise InputTypeError(
                "inputs must be a string or a non-empty list of strings and [text, text] pairs",
                param="inputs",
            )
        for i, x in enumerate(items):
            if not isinstance(x, str) and not is_pair(x):
                raise InputTypeError(
                    f"inputs[{i}] must be a string or a [text, text] pair, got {type(x).__name__}",
                    param="inputs",
                )
        seqs: list[list[int]] = [[] for _ in items]
        seconds = [0] * len(items)
        texts = [i for i, x in enumerate(items) if not is_pair(x)]
        if texts:
            options = self.inputs.options(truncate=cut)
            prepared = self.inputs.prepare([items[i] for i in texts], options)
            for i, seq in zip(texts, prepared.seqs, strict=True):
                seqs[i] = seq
        for i, item in enumerate(items):
            if is_pair(item):
                # its errors name the pair's texts: inputs[i][0] the query's, [1] the document's
                fields = Fields(f"inputs[{i}][0]", f"inputs[{i}]", first=1)
                pair = self.pairs.prepare(item[0], [item[1]], truncate=cut, fields=fields)
                seqs[i], seconds[i] = pair.seqs[0], pair.second_segment[0]
        return PreparedClassify(seqs, seconds, single)

    def scores(self, logits: np.ndarray, *, raw: bool = False) -> np.ndarray:
        """[N, num_labels] float32: the labels' probabilities (the logits with `raw`)."""
        logits = np.asarray(logits, dtype=np.float32).reshape(-1, self.labels.num_labels)
        return logits if raw else self.labels.activate(logits)

    def predictions(self, scores: np.ndarray, top_k: int | None = None) -> list[list[Prediction]]:
        """Per input, its labels by descending score (ties in label order), the first `top_k`."""
        names = self.labels.labels
        out = []
        for row in np.asarray(scores):
            order = np.argsort(-row, kind="stable")[:top_k]
            out.append([Prediction(names[j], float(row[j])) for j in order])
        return out


def is_pair(x: Any) -> bool:
    """A pair of texts: a list or tuple of two strings."""
    return isinstance(x, (list, tuple)) and len(x) == 2 and all(isinstance(t, str) for t in x)


def _truncate(value: Any) -> Any:
    """A classify `truncate` as the request core's: False, "end" or "start"."""
    if value is None or value is False:
        return False
    if value is True:
        return "end"
    if value in ("end", "start"):
        return value
    raise InputError(
        f'truncate must be true, false, "end" or "start" for classification; got {shown(value)}',
        param="truncate",
    )
