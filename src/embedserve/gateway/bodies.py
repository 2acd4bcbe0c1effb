"""The embeddings routes' answers (OpenAI's list of embedding objects, the contextualized
documents' lists of them), apart from the pipeline that computes their rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from embedserve.core.head import to_base64


def embedding_objects(vectors: np.ndarray, encoding_format: str) -> list[dict[str, Any]]:
    """`{"object": "embedding", "index": i, "embedding": ...}` per row; float rows stay NumPy
    arrays for orjson to write directly."""
    if encoding_format == "base64":
        rows: list[Any] = [to_base64(v) for v in vectors]
    else:
        rows = list(vectors)
    return [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]


def embeddings_body(
    vectors: np.ndarray, encoding_format: str, model: str, num_tokens: int
) -> dict[str, Any]:
    """The OpenAI response object."""
    return {
        "object": "list",
        "data": embedding_objects(vectors, encoding_format),
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def contextual_body(
    documents: list[np.ndarray], encoding_format: str, model: str, num_tokens: int
) -> dict[str, Any]:
    """Per document, a list object of its chunks' embedding objects (docs/serving.md)."""
    return {
        "object": "list",
        "data": [
            {"object": "list", "index": d, "data": embedding_objects(rows, encoding_format)}
            for d, rows in enumerate(documents)
        ],
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }
