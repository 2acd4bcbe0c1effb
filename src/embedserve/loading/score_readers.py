"""What an LLM reranker's folder says about its score: its answer token ids (read by `spec`; a
cross-encoder's activation is `labels.cross_encoder_activation`)."""

from __future__ import annotations

from pathlib import Path

from embedserve.loading.family_configs import ModelLoadError


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
