"""The gateway's models as its flags give them: each model's served names, folder and replicas
(`--model [NAME=]MODEL`, `--served-model-name`, `--replica [NAME=]ADDRESS`), and the request
core and limits read from each model's folder.

One model keeps the single-model flags as they always were (`--replica HOST:PORT`, names from
`--served-model-name` or the bundled / folder name). With several, each `--replica` names its
model (`NAME=HOST:PORT`) and each model its name (`NAME=MODEL`, else its default name).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from embedserve.core.inputs import InputPreparer
from embedserve.core.outputs import min_dimensions
from embedserve.core.pairs import PairPreparer, scoring_kind
from embedserve.core.tokenization import TextTokenizer
from embedserve.gateway.models import split_named
from embedserve.gateway.requests import Limits
from embedserve.loading.bundled import BUNDLED, resolve_model
from embedserve.loading.hub import is_hub_id
from embedserve.loading.spec import read_model_spec
from embedserve.retrieval.outputs import MAX_MULTIVECTOR_VALUES


@dataclass(frozen=True)
class ModelEntry:
    names: tuple[str, ...]  # what clients send as `model`; the first is reported
    model: str  # folder, bundled name or Hub id
    replicas: tuple[str, ...]  # its servers' addresses


def default_names(model: str) -> tuple[str, ...]:
    """The name clients use for a model by default: the bundled name, the Hub id (without its
    revision) or the folder's name."""
    if model in BUNDLED:
        return (model,)
    path = Path(model).expanduser()
    if not path.is_dir() and is_hub_id(model):  # clients send the Hub id as `model`
        return (model.partition("@")[0],)
    return (path.resolve().name,)


def model_entries(
    models: Sequence[str], served_names: Sequence[str], replicas: Sequence[str]
) -> list[ModelEntry]:
    """Each model's names, folder and replicas; a ValueError saying which flag is wrong."""
    named = [split_named(m) for m in models]
    if len(named) > 1 and served_names:
        raise ValueError(
            "--served-model-name names the one model of a gateway; with several, name each "
            "as --model NAME=MODEL"
        )
    names = [
        (name,) if name else tuple(served_names) or default_names(model) for name, model in named
    ]
    owner = {n: i for i, ns in enumerate(names) for n in ns}
    if len(owner) < sum(map(len, names)):
        raise ValueError(
            "two models have the same served name: give each its own with --model NAME=MODEL"
        )
    addresses: list[list[str]] = [[] for _ in named]
    for replica in replicas:
        name, address = split_named(replica)
        if name is None and len(named) == 1:
            addresses[0].append(replica)
        elif name is None:
            raise ValueError(
                f"--replica {replica}: with several models each replica names its model, "
                f"NAME=HOST:PORT (NAME one of {', '.join(ns[0] for ns in names)})"
            )
        elif name not in owner:
            raise ValueError(
                f"--replica {replica}: no model is served as {name!r} (served: "
                f"{', '.join(ns[0] for ns in names)})"
            )
        else:
            addresses[owner[name]].append(address)
    for ns, found in zip(names, addresses, strict=True):
        if not found:
            raise ValueError(f"model {ns[0]!r} has no --replica {ns[0]}=HOST:PORT")
    return [
        ModelEntry(ns, model, tuple(found))
        for ns, (_, model), found in zip(names, named, addresses, strict=True)
    ]


def load_model(
    entry: ModelEntry,
    max_inputs: int,
    max_chunks: int,
    max_multivector_values: int = MAX_MULTIVECTOR_VALUES,
) -> tuple[Limits, InputPreparer, PairPreparer | None]:
    """A model's limits and request core, from its folder (its tokenizer and spec; no weights)."""
    folder = resolve_model(entry.model)
    spec = read_model_spec(folder)
    tokenizer = TextTokenizer(folder / "tokenizer.json", spec.max_seq_length)
    inputs = InputPreparer(spec, tokenizer)
    pairs = PairPreparer(spec, tokenizer) if spec.score is not None else None
    limits = Limits(
        spec.hidden_size,
        max_inputs,
        entry.names,
        min_dimensions=min_dimensions(spec.output_rules, spec.hidden_size),
        default_output_dtype=spec.default_output_dtype,
        max_chunks=max_chunks,
        task=spec.task,
        # a sparse or multi-vector model scores by its own outputs (`retrieval.scores.late_plan`)
        scoring=spec.retrieval.kind if spec.retrieval is not None else scoring_kind(spec),
        outputs=tuple(spec.outputs),
        retrieval=spec.retrieval.kind if spec.retrieval is not None else None,
        multivector_dims=spec.retrieval.multivector_dims if spec.retrieval is not None else 0,
        max_multivector_values=max_multivector_values,
    )
    return limits, inputs, pairs
