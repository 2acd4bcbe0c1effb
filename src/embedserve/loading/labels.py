"""A sequence classifier's labels and activation (task "classify"), read from its config.json.

A `*ForSequenceClassification` folder with more than one label classifies: one logit per label
from the same head a cross-encoder has (the pooler, dense + tanh on CLS, then the classifier),
turned into probabilities by the activation transformers' own loss implies:

- `"problem_type": "multi_label_classification"`: sigmoid per label (each label its own yes/no;
  the probabilities need not sum to one);
- anything else (`"single_label_classification"`, or no `problem_type`, as most published
  classifiers ship): softmax over the labels.

`id2label` names the labels (keys are the logits' indices); without it they are `LABEL_0` ...,
as transformers names them. A one-label classifier is a cross-encoder (task "score", `spec`).
No torch: the gateway reads this.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from embedserve.loading.family_configs import ModelLoadError

LabelActivation = Literal["softmax", "sigmoid"]


@dataclass(frozen=True)
class LabelSpec:
    """What a classifier's logits mean: one label per column, and how they become scores."""

    labels: tuple[str, ...]  # in logit order
    activation: LabelActivation

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def activate(self, raw: Any) -> np.ndarray:
        """Logits [N, num_labels] -> probabilities [N, num_labels] float32 (in float64 first,
        so a softmax of large logits neither overflows nor loses the small ones)."""
        x = np.asarray(raw, dtype=np.float64).reshape(-1, self.num_labels)
        if self.activation == "sigmoid":
            from embedserve.core.head import sigmoid  # numpy only

            return sigmoid(x)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def num_labels(cfg: dict[str, Any]) -> int:
    """Labels of a config.json: `id2label`'s, else `num_labels`, else transformers' default 2."""
    labels = cfg.get("id2label")
    return len(labels) if isinstance(labels, dict) else int(cfg.get("num_labels", 2))


def read_labels(cfg: dict[str, Any], config_path: Path) -> LabelSpec:
    """The classifier's labels and activation (see the module docstring)."""
    n = num_labels(cfg)
    given = cfg.get("id2label")
    if isinstance(given, dict):
        try:
            by_index = {int(k): str(v) for k, v in given.items()}
        except ValueError:
            raise ModelLoadError(f"{config_path}: id2label keys must be integers") from None
        if sorted(by_index) != list(range(n)):
            raise ModelLoadError(f"{config_path}: id2label must number its labels 0..{n - 1}")
        labels = tuple(by_index[i] for i in range(n))
    else:
        labels = tuple(f"LABEL_{i}" for i in range(n))
    if n < 2:
        raise ModelLoadError(f"{config_path}: a classifier needs two labels or more, got {n}")
    problem = cfg.get("problem_type")
    if problem not in (None, "single_label_classification", "multi_label_classification"):
        raise ModelLoadError(
            f"{config_path}: problem_type {problem!r} is not a classification "
            "(single_label_classification or multi_label_classification)"
        )
    activation: LabelActivation = (
        "sigmoid" if problem == "multi_label_classification" else "softmax"
    )
    return LabelSpec(labels, activation)


def cross_encoder_activation(
    cfg: dict[str, Any], config_path: Path
) -> Literal["sigmoid", "identity"]:
    """A cross-encoder's (one-label classifier's) activation, as sentence-transformers
    CrossEncoder reads it: `sentence_transformers.activation_fn`, else the older
    `sbert_ce_default_activation_function`, else sigmoid."""
    n = num_labels(cfg)
    if n != 1:
        raise ModelLoadError(
            f"{config_path}: a sequence classifier with {n} labels cannot rank; "
            "a reranker has one (a relevance logit)"
        )
    name = (cfg.get("sentence_transformers") or {}).get("activation_fn") or cfg.get(
        "sbert_ce_default_activation_function"
    )
    if name is None or str(name).endswith("Sigmoid"):
        return "sigmoid"
    if str(name).endswith("Identity"):
        return "identity"
    raise ModelLoadError(
        f"{config_path}: activation {name!r} is not supported; expected Sigmoid or Identity"
    )
