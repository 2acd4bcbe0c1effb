"""What a scoring model's folder says about its score: a cross-encoder's activation, an LLM
reranker's answer token ids (read by `spec`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from embedserve.loading.family_configs import ModelLoadError

Activation = Literal["sigmoid", "identity"]


def classifier_activation(cfg: dict[str, Any], config_path: Path) -> Activation:
    """A cross-encoder's activation, as sentence-transformers CrossEncoder reads it."""
    labels = cfg.get("id2label")
    num_labels = len(labels) if isinstance(labels, dict) else int(cfg.get("num_labels", 2))
    if num_labels != 1:
        raise ModelLoadError(
            f"{config_path}: a sequence classifier with {num_labels} labels cannot rank; "
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


def answer_ids(path: Path, answers: tuple[str, ...]) -> tuple[int, int]:
    """The token ids of an LLM reranker's answers ("yes", "no") in the folder's tokenizer."""
    from tokenizers import Tokenizer  # no torch

    tokenizer_path = path / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    except Exception as e:  # tokenizers raises a bare Exception
        raise ModelLoadError(f"{tokenizer_path}: cannot read the tokenizer ({e})") from None
    ids = [tokenizer.token_to_id(t) for t in answers]
    if None in ids:
        named = " and ".join(map(repr, answers))
        raise ModelLoadError(f"{tokenizer_path}: no single token for {named}")
    return ids[0], ids[1]  # type: ignore[return-value]
