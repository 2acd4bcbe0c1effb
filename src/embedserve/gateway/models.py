"""Several models behind one gateway: which served model a request goes to.

Each served model has its own request core (`InputPreparer` / `PairPreparer`), `Limits` and
`Pipeline`, whose `ReplicaPool` holds only that model's servers: one model's full queues, slow
requests or dead replicas are never another's (they share nothing but the gateway's event loop).

The rule a request follows (docs/serving.md, "Several models"):

- one model served: every request goes to it, as with a single-model gateway (an unknown
  `model` is a 404 from the request check, a reranker on an embedding route a 400);
- several: a `model` naming a served model picks it (unknown: 404 listing the served names); a
  request without `model` goes to the only model that does the route's task (embedding routes:
  the only embedder; scoring routes: the only reranker, else the only embedder, by cosine); where
  more than one could, the task's default model (`serve --default-model [TASK=]NAME`) takes it,
  else `model` is required (400 naming them and the flag). A reranker asked to embed is a 400
  naming the models that embed. Routes of no one task (`POST /`, `/info`, `/tokenize`) go to
  the default model (`--default-model NAME`, no task), else need `model`.
- outputs: an embedding route asks for dense vectors, unless it names other `outputs` (sparse,
  multivector: `gateway.output_bodies`); only a model with every output asked is picked, and a model
  without one is a 400 naming the outputs it has (and the models that have them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from embedserve.gateway.errors import ApiError, bad_request
from embedserve.gateway.pipeline import Pipeline
from embedserve.gateway.requests import Limits

EMBED = "embed"  # a route that embeds: only embedding models do
SCORE = "score"  # a route that scores pairs: rerankers, or embedders by cosine
CLASSIFY = "classify"  # a route that gives each label's probability: sequence classifiers
ANY = "any"  # /tokenize: every model tokenizes


@dataclass
class ServedModel:
    """One model of the gateway: its limits, and its pipeline once the worker has started."""

    limits: Limits
    make_pipeline: Callable[[], Pipeline]
    pipeline: Pipeline | None = field(default=None)
    max_tokens_per_request: int | None = None  # for /v1/models (None: not stated)

    @property
    def name(self) -> str:
        return self.limits.model_names[0]

    @property
    def embeds(self) -> bool:
        return self.limits.task == "embed"

    def does(self, task: str) -> bool:
        """Whether the model answers a route of `task` (an embedder scores by cosine too)."""
        if task == EMBED:
            return self.embeds
        if task == SCORE:
            return self.limits.task in ("score", "embed")
        if task == CLASSIFY:
            return self.limits.task == "classify"
        return True  # tokenize, models: every model

    @property
    def embeds_dense(self) -> bool:
        return self.embeds and self.has(("dense",))

    def has(self, outputs: Sequence[str]) -> bool:
        return all(o in self.limits.outputs for o in outputs)

    def started(self) -> Pipeline:
        if self.pipeline is None:
            raise ApiError(503, "the gateway is starting", code="starting")
        return self.pipeline

    def describe(self) -> dict[str, Any]:
        """This model's entry in /v1/models (OpenAI's fields first, then what it does here)."""
        limits = self.limits
        outputs = list(limits.outputs) if self.embeds else ["score"]
        return {
            "id": self.name,
            "object": "model",
            "created": 0,
            "owned_by": "embedserve",
            # what the model does here: "embed" (embeddings, and rerank by cosine) or "score"
            # (a reranker: /v1/rerank, /rerank and /v1/score only), and how it scores (a sparse
            # or multi-vector model: splade, bge-m3 or colbert, by its own outputs)
            "task": limits.task,
            "scoring": limits.scoring,
            "aliases": list(limits.model_names[1:]),
            "dimensions": limits.hidden_size if self.embeds_dense else None,
            "min_dimensions": limits.min_dimensions if self.embeds_dense else None,
            "outputs": outputs,
            "limits": {
                "max_inputs": limits.max_inputs,
                "max_tokens_per_request": self.max_tokens_per_request,
                "max_chunks_per_document": limits.max_chunks,
                "max_multivector_values": (
                    limits.max_multivector_values if "multivector" in limits.outputs else None
                ),
            },
        }


DEFAULT_TASKS = (EMBED, SCORE, CLASSIFY)


class ServedModels:
    """The models of one gateway, in the order given, and the default model of each task for
    requests that name none (`defaults`: `[TASK=]NAME` entries, as `--default-model` takes)."""

    def __init__(self, models: Sequence[ServedModel], defaults: Sequence[str] = ()) -> None:
        if not models:
            raise ValueError("a gateway serves at least one model")
        self.models = list(models)
        self.by_name: dict[str, ServedModel] = {}
        for m in self.models:
            for name in m.limits.model_names:
                if name in self.by_name:
                    raise ValueError(f"two served models are named {name!r}: give each its own")
                self.by_name[name] = m
        self.defaults = self._read_defaults(defaults)

    def _read_defaults(self, entries: Sequence[str]) -> dict[str, ServedModel]:
        """{task: model} of `--default-model` entries: TASK=NAME for one task (an embedder may
        be the score default: it scores by cosine); a NAME alone for its own task and the
        routes of no one task (ANY)."""
        out: dict[str, ServedModel] = {}
        for entry in entries:
            task, sep, name = entry.partition("=")
            if not sep:
                task, name = "", entry
            model = self.by_name.get(name)
            if model is None or (sep and task not in DEFAULT_TASKS):
                raise ValueError(
                    f"--default-model {entry!r}: expected [TASK=]NAME, TASK one of "
                    f"{', '.join(DEFAULT_TASKS)}, NAME one of {', '.join(self.names())}"
                )
            tasks = [task] if sep else [ANY, model.limits.task]  # its own task, not cosine
            for t in tasks:
                if not model.does(t):
                    raise ValueError(f"--default-model {entry!r}: {name!r} does not {t}")
                out[t] = model
        return out

    @property
    def first(self) -> ServedModel:
        """The model a route of no one task reports (`/info`, `POST /`): the default, else the
        first given."""
        return self.defaults.get(ANY, self.models[0])

    @property
    def several(self) -> bool:
        return len(self.models) > 1

    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def pick(self, body: Any, task: str, outputs: Sequence[str] | None = None) -> ServedModel:
        """The model a request body (parsed JSON, any shape) goes to on a route of `task`;
        `outputs`: what an embedding route asks for (None: dense vectors)."""
        if outputs is None and task == EMBED:
            outputs = ("dense",)
        if not self.several:  # the single-model gateway's checks, unchanged, do the rest
            only = self.models[0]
            if not only.does(task):
                raise _wrong_task(only, task, [])
            if outputs and not only.has(outputs):
                raise _missing_outputs(only, outputs, [])
            return only
        name = body.get("model") if isinstance(body, dict) else None
        if name is None:
            return self._default(task, outputs or ())
        if not isinstance(name, str):
            raise bad_request(
                f"'model' must be a string, got {type(name).__name__}",
                param="model",
                code="invalid_type",
            )
        found = self.by_name.get(name)
        if found is None:
            raise ApiError(
                404,
                f"model {name!r} is not served here; available: {', '.join(self.names())}",
                param="model",
                code="model_not_found",
            )
        if not found.does(task):
            raise _wrong_task(found, task, [m.name for m in self.models if m.does(task)])
        if outputs and not found.has(outputs):
            others = [m.name for m in self.models if m.does(task) and m.has(outputs)]
            raise _missing_outputs(found, outputs, others)
        return found

    def unnamed(self, task: str, outputs: Sequence[str] = ()) -> int | None:
        """The place of the model a body naming none goes to on a route of `task` asking
        `outputs` (the native front takes these picks: `Gateway.set_unnamed`); None where the
        rule picks none (the route answers why)."""
        try:
            return self.models.index(self._default(task, outputs))
        except ApiError:
            return None

    def _default(self, task: str, outputs: Sequence[str]) -> ServedModel:
        default = self.defaults.get(task)
        if default is not None and default.has(outputs):
            return default
        if task == SCORE:  # a reranker first; else an embedder, by cosine
            choices = [m for m in self.models if m.limits.task == "score"]
            choices = choices or [m for m in self.models if m.does(SCORE)]
        else:
            choices = [m for m in self.models if m.does(task) and m.has(outputs)]
        if len(choices) == 1:
            return choices[0]
        if not choices:
            raise bad_request(
                f"no model served here does this; served: {', '.join(self.names())}",
                param="model",
                code="wrong_model_task",
            )
        raise bad_request(
            "several models are served here: 'model' is required, one of "
            f"{', '.join(m.name for m in choices)} (or start serve with --default-model "
            f"{'' if task == ANY else task + '='}NAME)",
            param="model",
            code="missing_required_parameter",
        )

    def not_ready(self) -> list[str]:
        """The models without a healthy server replica (or not started yet)."""
        return [
            m.name
            for m in self.models
            if m.pipeline is None or m.pipeline.replicas.num_healthy == 0
        ]


# what a model of each task is, and the routes that serve it: the 400 of a route it does not do
_WHAT = {
    "score": ("a reranker: it scores query/document pairs and does not embed",
              "/v1/rerank, /rerank or /v1/score"),
    "classify": ("a sequence classifier: it gives each label's probability and neither embeds "
                 "nor ranks", "/predict or /classify"),
    "embed": ("an embedding model, not a sequence classifier", "/v1/embeddings"),
}  # fmt: skip


def _wrong_task(model: ServedModel, task: str, others: list[str]) -> ApiError:
    what, routes = _WHAT[model.limits.task]
    where = f"models that {task}: {', '.join(others) or 'none'}" if others else f"use {routes}"
    return bad_request(
        f"model {model.name!r} is {what}; {where}", param="model", code="wrong_model_task"
    )


def _missing_outputs(model: ServedModel, outputs: Sequence[str], others: list[str]) -> ApiError:
    lacking = [o for o in outputs if o not in model.limits.outputs]
    where = f"; models with them: {', '.join(others)}" if others else ""
    return bad_request(
        f"model {model.name!r} has no {' or '.join(lacking)} output; its outputs are "
        f"{', '.join(model.limits.outputs)} (ask for them with 'outputs' on /v1/embeddings)"
        f"{where}",
        param="outputs",
        code="output_not_available",
    )


def split_named(value: str) -> tuple[str | None, str]:
    """`NAME=VALUE` as (NAME, VALUE); a value without a `NAME=` prefix as (None, value). A
    prefix holding `/` or `:` is part of a path or an address, not a name."""
    name, sep, rest = value.partition("=")
    if sep and name and not any(c in name for c in "/:") and rest:
        return name, rest
    return None, value
