"""A sparse or multi-vector model's requests on the server (SPLADE, bge-m3, ColBERT): what they
ask, the checks against the model's outputs and the multi-vector size bound, and each request's
answer cut from its batch's outputs (`Engine.encode_outputs`, one forward for every output
asked)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.contract.codec import encode_outputs_response
from embedserve.loading.retrieval import RetrievalSpec
from embedserve.retrieval.results import check_multivector_size, multivector_rows
from embedserve.server.scheduler import Pending

# what a request asks: (outputs, query side, attended leading tokens per sequence or None)
OutputsAsk = tuple[tuple[str, ...], bool, "tuple[int, ...] | None"]


def check_asked(outputs: tuple[str, ...], served: bool, model_outputs: tuple[str, ...]) -> None:
    """A ValueError (INVALID_ARGUMENT) for outputs this server's model does not have."""
    if not served or not model_outputs:
        raise ValueError(
            "this server's model has no sparse or multi-vector outputs (dense rows only)"
        )
    wrong = [o for o in outputs if o not in model_outputs]
    if wrong:
        raise ValueError(
            f"this server's model has no {', '.join(wrong)} output; its outputs are "
            f"{', '.join(model_outputs)}"
        )


@dataclass(frozen=True)
class MultivectorLimit:
    """The bound on one call's multi-vector answer (floats: token vectors x dims), checked on
    the ids a call sends before it is queued: the gateway checks its requests too, but a call
    from another client, or from a gateway whose bound is larger, is refused here all the
    same."""

    spec: RetrievalSpec
    max_values: int

    @classmethod
    def of(cls, retrieval: RetrievalSpec | None, max_values: int) -> MultivectorLimit | None:
        """The bound for an engine whose record (`EngineSeam.retrieval`) is `retrieval`; None
        for a model without sparse or multi-vector outputs."""
        return None if retrieval is None else cls(retrieval, max_values)

    def check(self, input_ids: np.ndarray, seqlens: np.ndarray, query: bool) -> None:
        """An InputError (a ValueError: INVALID_ARGUMENT) naming the size and the bound."""
        rows = multivector_rows(self.spec, input_ids, seqlens, query=query)
        check_multivector_size(rows.tolist(), self.spec.multivector_dims, self.max_values)


def pack_visible(batch: list[Pending]) -> tuple[int, ...] | None:
    """Per sequence of the packed batch, its attended leading tokens; None when all are."""
    if all(r.visible is None for r in batch):
        return None
    return tuple(
        v for r in batch for v in (r.visible if r.visible is not None else r.batch.seqlens.tolist())
    )


def outputs_answers(outputs: Any, batch: list[Pending]) -> list[Any]:
    """Each request's EmbedResponse from a batch's `BatchOutputs` (None for a cancelled one):
    its sequences' dense rows under its head, sparse entries and token vectors."""
    answers: list[Any] = []
    start = 0
    for request in batch:
        stop = start + request.batch.num_seqs
        rows = slice(start, stop)
        start = stop
        if request.cancelled():
            answers.append(None)
            continue
        assert request.head is not None  # a request for outputs always has one (the codec's)
        dense = outputs.dense[rows] if outputs.dense is not None else None
        sparse = vectors = None
        if outputs.sparse is not None:
            o = outputs.sparse.offsets[rows.start : rows.stop + 1]
            part = slice(int(o[0]), int(o[-1]))
            sparse = (np.diff(o), outputs.sparse.indices[part], outputs.sparse.values[part])
        if outputs.multivector is not None:
            o = outputs.multivector.offsets[rows.start : rows.stop + 1]
            vectors = (np.diff(o), outputs.multivector.vectors[int(o[0]) : int(o[-1])])
        answers.append(encode_outputs_response(request.head, dense, sparse, vectors))
    return answers
