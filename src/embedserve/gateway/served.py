"""The gateway's models as its flags give them: each model's served names, folder and replicas
(`--model [NAME=]MODEL`, `--served-model-name`, `--replica [NAME=]ADDRESS`), and the request
core and limits read from each model's folder.

One model keeps the single-model flags as they always were (`--replica HOST:PORT`, names from
`--served-model-name` or the bundled / folder name). With several, each `--replica` names its
model (`NAME=HOST:PORT`) and each model its name (`NAME=MODEL`, else its default name).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedserve.core.head import min_dimensions
from embedserve.core.inputs import InputPreparer
from embedserve.core.pairs import PairPreparer, scoring_kind
from embedserve.core.tokenization import TextTokenizer
from embedserve.gateway.models import split_named
from embedserve.gateway.requests import Limits
from embedserve.loading.bundled import BUNDLED, hub_names, resolve_model
from embedserve.loading.hub import is_hub_id
from embedserve.loading.spec import read_model_spec
from embedserve.retrieval.results import MAX_MULTIVECTOR_VALUES

# The gateway's limits a model may set for itself (`--model-limit NAME:KEY=VALUE`, a models
# file's keys): each is the GatewayConfig field of that name, whose value a model without its own
# takes.
PER_MODEL_LIMITS = (
    "max_inputs",
    "max_tokens_per_request",
    "max_chunks_per_document",
    "part_tokens",
)


@dataclass(frozen=True)
class ModelEntry:
    names: tuple[str, ...]  # what clients send as `model`; the first is reported
    model: str  # folder, bundled name or Hub id
    replicas: tuple[str, ...]  # its servers' addresses
    # each of PER_MODEL_LIMITS: the model's own value, else the gateway-wide one (None: unset)
    limits: Mapping[str, Any] = field(default_factory=dict)


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
    models: Sequence[str],
    served_names: Sequence[str],
    replicas: Sequence[str],
    model_limits: Sequence[str] = (),
    defaults: Mapping[str, int | None] | None = None,
) -> list[ModelEntry]:
    """Each model's names, folder, replicas and limits (`defaults`: the gateway-wide values of
    PER_MODEL_LIMITS); a ValueError saying which flag is wrong."""
    named = [split_named(m) for m in models]
    if len(named) > 1 and served_names:
        raise ValueError(
            "--served-model-name names the one model of a gateway; with several, name each "
            "as --model NAME=MODEL"
        )
    names = [
        (name,) if name else tuple(served_names) or default_names(model) for name, model in named
    ]
    taken = {n for ns in names for n in ns}
    names = [  # a bundled model under its own name answers to its Hub names too, if free
        ns + tuple(n for n in hub_names(model) if n not in taken)
        if model in BUNDLED and (name or model) == model and not served_names
        else ns
        for ns, (name, model) in zip(names, named, strict=True)
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
    limits = [dict(defaults or {}) for _ in named]
    for given in model_limits:
        name, key, value = _model_limit(given, [ns[0] for ns in names])
        limits[owner[name]][key] = value
    return [
        ModelEntry(ns, model, tuple(found), own)
        for ns, (_, model), found, own in zip(names, named, addresses, limits, strict=True)
    ]


def _model_limit(given: str, served: list[str]) -> tuple[str, str, int]:
    """`--model-limit NAME:KEY=VALUE` as (NAME, KEY, VALUE), or a ValueError saying what is
    wrong (a name holds no `:`, `split_named`)."""
    name, _, setting = given.partition(":")
    key, sep, text = setting.partition("=")
    where = f"--model-limit {given}"
    if not sep or not name:
        raise ValueError(f"{where}: expected NAME:KEY=VALUE, e.g. {served[0]}:max_inputs=64")
    if name not in served:
        raise ValueError(f"{where}: no model is served as {name!r} (served: {', '.join(served)})")
    if key not in PER_MODEL_LIMITS:
        raise ValueError(
            f"{where}: {key!r} is not a per-model limit ({', '.join(PER_MODEL_LIMITS)})"
        )
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{where}: {key} must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"{where}: {key} must be a positive integer, got {value}")
    return name, key, value


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
