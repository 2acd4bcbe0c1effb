"""The one registry of retrieval kinds: a row per sparse or multi-vector layout says how a folder
is recognised and read, which outputs it has, which engine heads make them, which tokens give a
multi-vector row, and how it scores a query against documents. The loader, the engine, the
server, the gateway and the CLI read the row (`KIND_BY_NAME[spec.retrieval.kind]`) where they
would otherwise test the kind's name.

Adding a kind is one row here, its folder reader (`retrieval`), its family row binding it to an
encoder (`families.RETRIEVAL_FAMILIES`, `marker` the row's name) and one head file under
`engine/heads/` (named by the row's `heads`, a dotted path, so this module never imports torch:
the gateway reads model folders with it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from embedserve.loading.retrieval import (
    Output,
    RetrievalSpec,
    is_bge_m3,
    is_colbert,
    is_splade,
    read_colbert,
    read_m3,
    read_splade,
)

# how a query is scored against a document (`retrieval.scores`): the sparse dot product of the
# lexical weights, MaxSim of the token vectors, or bge-m3's weighted mean of its three scores
ScoreRule = Literal["sparse_dot", "maxsim", "weighted"]
# which tokens of an input give a multi-vector row (the engine's heads and the server's size
# bound alike): every token after the first (CLS), or a query's every token and a document's
# all but its skip-list ("": no multi-vector output)
TokenRule = Literal["", "after_first", "skiplist"]

# bge-m3's separate scores, as FlagEmbedding's `compute_score` names them (`retrieval.scores`)
M3_MODES = ("dense", "sparse", "colbert", "sparse+dense", "colbert+sparse+dense")


@dataclass(frozen=True)
class RetrievalKind:
    """One row of the registry (see the module docstring)."""

    name: str  # `RetrievalSpec.kind`, its family row's `marker`, what /v1/models says it scores by
    title: str  # the name in messages
    outputs: tuple[Output, ...]  # what it embeds, in this order
    detect: Callable[[Path], bool]  # a folder of its family's model types is this kind
    # the folder's head settings, filled into a spec that holds the row's name and outputs
    read: Callable[[RetrievalSpec, Path, int], RetrievalSpec]
    heads: str  # "module:Class" of its engine heads (imported by the engine only)
    score: ScoreRule
    score_words: str  # its score in messages
    multivector_tokens: TokenRule = ""
    # its sentence-transformers Dense modules project every token (its multi-vector head), so
    # they are not a pooled vector's projection
    token_dense: bool = False
    # the `input_type` its queries and its documents are encoded with when it scores
    score_input_types: tuple[str | None, str | None] = ("query", "document")
    score_weights: tuple[str, ...] = ()  # the weights its score takes, by name (none: fixed)
    score_modes: tuple[str, ...] = ()  # its separate scores (`Scorer.score_modes`)


RETRIEVAL_KINDS: tuple[RetrievalKind, ...] = (
    RetrievalKind(
        "splade",
        "SPLADE",
        ("sparse",),
        is_splade,
        read_splade,
        "embedserve.engine.heads.splade:SpladeHeads",
        score="sparse_dot",
        score_words="the sparse dot product",
    ),
    RetrievalKind(
        "bge-m3",
        "bge-m3",
        ("dense", "sparse", "multivector"),
        is_bge_m3,
        read_m3,
        "embedserve.engine.heads.bge_m3:M3Heads",
        score="weighted",
        score_words="its weighted dense + sparse + multi-vector sum",
        multivector_tokens="after_first",
        # FlagEmbedding's `compute_score` and SparseEncoder take no query side
        score_input_types=(None, None),
        score_weights=("dense", "sparse", "colbert"),
        score_modes=M3_MODES,
    ),
    RetrievalKind(
        "colbert",
        "ColBERT",
        ("multivector",),
        is_colbert,
        read_colbert,
        "embedserve.engine.heads.colbert:ColbertHeads",
        score="maxsim",
        score_words="MaxSim",
        multivector_tokens="skiplist",
        token_dense=True,
    ),
)

KIND_BY_NAME = {k.name: k for k in RETRIEVAL_KINDS}


def read_retrieval(folder: Path, kind: str, hidden: int) -> RetrievalSpec:
    """The outputs and head settings of a folder of the given kind (its family's `marker`)."""
    row = KIND_BY_NAME.get(kind)
    if row is None:
        raise ValueError(f"unknown retrieval kind {kind!r}")
    return row.read(RetrievalSpec(row.name, row.outputs), folder, hidden)
