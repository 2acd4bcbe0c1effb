"""What an encode of a sparse or multi-vector model returns, and the stated limit on its size.

- dense: [inputs, dims] float32 (after the usual head: truncation, normalization, encoding);
- sparse: per input `{"indices": [...], "values": [...]}` (ascending token ids, values > 0), the
  shape Qdrant, Milvus and Pinecone take;
- multivector: per input a [tokens, dims] float32 array of unit vectors.

A multi-vector answer is tokens x dims floats per input, so one call is capped at
`MAX_MULTIVECTOR_VALUES` floats in all (128 MiB of float32); more is an `InputError` that says so,
raised before the model runs: by the offline `Embedder` and the gateway on the sequences they
prepare, and by the server on the token ids it is sent (`multivector_rows`), whoever sent them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from embedserve.errors import InputError
from embedserve.loading.retrieval import RetrievalSpec
from embedserve.loading.retrieval_kinds import KIND_BY_NAME, RETRIEVAL_KINDS

# floats of multi-vector output per call: 32 Mi (128 MiB as float32), e.g. 64 bge-m3 documents of
# 512 tokens (1,024 dims) or 1,165 ColBERT documents of 300 tokens at 96 dims
MAX_MULTIVECTOR_VALUES = 32 * 2**20


class SparseVector(TypedDict):
    indices: list[int]
    values: list[float]


@dataclass(frozen=True)
class EncodedOutputs:
    """The outputs asked for, each in input order (None where not asked for)."""

    dense: np.ndarray | None = None
    sparse: list[SparseVector] | None = None
    multivector: list[np.ndarray] | None = None
    # per input, the tokens the model ran (markers and query expansion included): for tokens/s
    tokens: list[int] | None = None

    def __len__(self) -> int:
        """The number of inputs."""
        present = (x for x in (self.dense, self.sparse, self.multivector) if x is not None)
        return len(next(present, ()))

    def rows(self, start: int, stop: int) -> EncodedOutputs:
        """The outputs of inputs [start, stop)."""
        return EncodedOutputs(
            None if self.dense is None else self.dense[start:stop],
            None if self.sparse is None else self.sparse[start:stop],
            None if self.multivector is None else self.multivector[start:stop],
        )

    def row(self, i: int) -> EncodedOutputs:
        return self.rows(i, i + 1)


def join_outputs(
    parts: Sequence[EncodedOutputs], groups: Sequence[np.ndarray] | None = None
) -> EncodedOutputs:
    """The outputs of consecutive parts of one input list, as one (each part asked alike);
    with `groups` (`core.budget.by_length_groups`: each part's input indices), put back in
    input order."""
    first = parts[0]
    joined = EncodedOutputs(
        None if first.dense is None else np.concatenate([p.dense for p in parts]),
        None if first.sparse is None else [v for p in parts for v in p.sparse or ()],
        None if first.multivector is None else [v for p in parts for v in p.multivector or ()],
    )
    if groups is None or len(joined) < 2:
        return joined
    where = np.empty(len(joined), dtype=np.intp)  # input i's joined row
    where[np.concatenate(groups)] = np.arange(len(joined))
    return EncodedOutputs(
        None if joined.dense is None else joined.dense[where],
        None if joined.sparse is None else [joined.sparse[j] for j in where],
        None if joined.multivector is None else [joined.multivector[j] for j in where],
    )


def check_outputs(asked: str | Sequence[str] | None, available: Sequence[str]) -> tuple[str, ...]:
    """The outputs asked for (all the model has when None), each one the model has."""
    if asked is None:
        return tuple(available)
    names = (asked,) if isinstance(asked, str) else tuple(asked)
    wrong = [n for n in names if n not in available]
    if not names or wrong:
        raise InputError(
            f"outputs must be a non-empty list of {', '.join(available)} (what this model "
            f"has); got {list(names)!r}",
            param="outputs",
        )
    return tuple(dict.fromkeys(names))


def check_multivector_size(vectors_per_input: Sequence[int], dims: int, limit: int) -> None:
    """An InputError before the model runs when the multi-vector answer would be too large."""
    total = int(sum(vectors_per_input)) * dims
    if total > limit:
        raise InputError(
            f"the multi-vector output would be {sum(vectors_per_input)} token vectors x {dims} "
            f"dims = {total} floats, over the limit of {limit} per call; send fewer or shorter "
            "inputs per call",
            param="input",
            code="output_too_large",
        )


def multivector_rows(
    spec: RetrievalSpec, input_ids: np.ndarray, seqlens: np.ndarray, *, query: bool
) -> np.ndarray:
    """[S] the token vectors each packed sequence's multi-vector output has, from its token ids
    alone (the engine's kept tokens, `engine.retrieval.RetrievalHeads.kept`), by its kind's
    `multivector_tokens`: bge-m3 every token after CLS; a ColBERT query every token; a ColBERT
    document those not in the skip-list."""
    seqlens = np.asarray(seqlens, dtype=np.int64)
    rule = KIND_BY_NAME[spec.kind].multivector_tokens
    if rule == "after_first":
        return seqlens - 1
    if rule != "skiplist" or spec.colbert is None or query:
        return seqlens
    kept = ~np.isin(input_ids, np.asarray(spec.colbert.skiplist_ids, dtype=np.int64))
    seq_ids = np.repeat(np.arange(len(seqlens)), seqlens)
    return np.bincount(seq_ids[kept], minlength=len(seqlens))


# `default_outputs` in words, for the commands' --help
DEFAULT_OUTPUTS_RULE = "dense, or every output of a model without dense vectors ({})".format(
    "; ".join(
        f"{k.title}: {', '.join(k.outputs)}" for k in RETRIEVAL_KINDS if "dense" not in k.outputs
    )
)


def default_outputs(available: Sequence[str]) -> tuple[str, ...]:
    """What a file of vectors holds when no outputs are named: the dense vectors of a model that
    has them (bge-m3's sparse and multi-vector outputs only when asked for), else every output
    the model has (SPLADE: sparse; ColBERT: multivector)."""
    return ("dense",) if "dense" in available else tuple(available)


def chosen_outputs(asked: Sequence[str] | None, available: Sequence[str]) -> tuple[str, ...]:
    """The outputs a file of vectors holds: those asked for, each one the model has, else
    `default_outputs`."""
    return default_outputs(available) if asked is None else check_outputs(asked, available)


def split_outputs(text: str | None) -> tuple[str, ...] | None:
    """A command line's `--outputs dense,sparse,multivector` as names (None: not given)."""
    return None if text is None else tuple(n.strip() for n in text.split(",") if n.strip())


def parse_outputs(text: str | None, available: Sequence[str]) -> tuple[str, ...]:
    """`--outputs` checked against what the model has (see `chosen_outputs`)."""
    return chosen_outputs(split_outputs(text), available)
