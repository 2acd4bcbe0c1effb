"""A sparse or multi-vector model's outputs over HTTP (SPLADE, bge-m3, ColBERT).

- `POST /v1/embeddings` with `outputs` (any of "dense", "sparse", "multivector"): per input its
  `embedding` (dense, under the usual head), `sparse` as `{"indices", "values"}` (the shape
  Qdrant, Milvus and Pinecone take) and `multivector` as a list of vectors, all from one
  forward; `encoding_format` and `output_dtype` apply to the dense and the token vectors.
  `input_type` "query" encodes ColBERT queries (marker, expansion), else documents.
- `POST /embed_sparse` (text-embeddings-inference's): per input a list of `{"index", "value"}`.
- `/v1/rerank`, `/v1/score` (and the other scoring routes) score by the model's own rule
  (`retrieval.scores.late_plan`: MaxSim for ColBERT, the sparse dot product for SPLADE,
  bge-m3's weighted dense + sparse + multi-vector sum, `weights` a request parameter).

The sequences are prepared as the offline `Embedder` prepares them (`prepare_outputs`), the
answer's size bounded before any is sent (`Limits.max_multivector_values`), and the outputs
come back from the servers compactly (`contract.codec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.core.head import Head, check_output_dtype, encode, to_base64
from embedserve.errors import InputError
from embedserve.gateway.errors import bad_request
from embedserve.gateway.requests import (
    HEAD_FIELDS,
    Limits,
    check_model,
    check_object,
    input_value,
    optional_string,
)
from embedserve.gateway.scoring import tei_truncate
from embedserve.loading.retrieval import OUTPUTS
from embedserve.retrieval.results import EncodedOutputs, check_multivector_size, check_outputs

OUTPUTS_FIELDS = frozenset(
    {"input", "model", "encoding_format", "user", "truncate", "outputs", "input_type",
     "prompt_name", "prompt", *HEAD_FIELDS}
)  # fmt: skip
EMBED_SPARSE_FIELDS = frozenset(
    {"inputs", "truncate", "truncation_direction", "prompt_name", "model"}
)


def asked_outputs(body: Any) -> tuple[str, ...] | None:
    """The `outputs` a body asks for (None: not given, a dense-only request), read before the
    model is picked; each a known output name."""
    value = body.get("outputs") if isinstance(body, dict) else None
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, str) and v in OUTPUTS for v in value)
    ):
        raise bad_request(
            f"'outputs' must be a non-empty list of {', '.join(map(repr, OUTPUTS))}; got {value!r}",
            param="outputs",
            code="invalid_value",
        )
    return tuple(dict.fromkeys(value))


@dataclass(frozen=True)
class OutputsJob:
    inputs: Any  # as sent; `prepare_outputs` checks and tokenizes it
    outputs: tuple[str, ...]
    input_type: Any
    prompt_name: Any
    prompt: Any
    truncate: Any
    head: Head  # the dense vectors'; its output_dtype applies to the token vectors too
    encoding_format: str  # float | base64


def parse_outputs(
    body: Any, limits: Limits, head: Head, encoding_format: str, outputs: tuple[str, ...]
) -> OutputsJob:
    """A /v1/embeddings body with `outputs`, for a sparse or multi-vector model; `head` and
    `encoding_format` read as for any embeddings request."""
    body = check_object(body, OUTPUTS_FIELDS)
    check_model(body, limits)
    optional_string(body, "user")
    check_outputs(outputs, limits.outputs)
    if "multivector" in outputs:
        try:
            check_output_dtype(head.output_dtype, limits.multivector_dims)
        except ValueError as e:
            raise InputError(f"{e} (the multi-vector rows)", param="output_dtype") from None
    return OutputsJob(
        input_value(body, limits), outputs, body.get("input_type"), body.get("prompt_name"),
        body.get("prompt"), body.get("truncate"), head, encoding_format,
    )  # fmt: skip


def parse_embed_sparse(body: Any, limits: Limits, head: Head) -> OutputsJob:
    """TEI's `/embed_sparse` body as a job for the sparse output (TEI's `truncate`, a bool,
    with `truncation_direction`)."""
    body = check_object(body, EMBED_SPARSE_FIELDS)
    check_model(body, limits)
    inputs = input_value(body, limits, key="inputs")
    truncate = tei_truncate(body)
    return OutputsJob(
        inputs, ("sparse",), None, body.get("prompt_name"), None, truncate, head, "float"
    )


def check_size(vectors: list[int], limits: Limits, outputs: tuple[str, ...]) -> None:
    """The 400 of an answer over the multi-vector bound, before any part is sent."""
    if "multivector" in outputs:
        check_multivector_size(vectors, limits.multivector_dims, limits.max_multivector_values)


def _vectors(rows: np.ndarray, head: Head, encoding_format: str) -> Any:
    """One input's token vectors [tokens, dims] as the answer writes them."""
    out = encode(rows, head.output_dtype)
    return [to_base64(r) for r in out] if encoding_format == "base64" else out


def outputs_body(
    encoded: EncodedOutputs, job: OutputsJob, model: str, num_tokens: int
) -> dict[str, Any]:
    """The OpenAI list object, each item with the outputs asked for: `embedding` (dense),
    `sparse` ({"indices", "values"}), `multivector` (a list of vectors)."""
    data: list[dict[str, Any]] = []
    for i in range(len(encoded)):
        item: dict[str, Any] = {"object": "embedding", "index": i}
        if encoded.dense is not None:  # the head was applied on the server
            row = encoded.dense[i]
            item["embedding"] = to_base64(row) if job.encoding_format == "base64" else row
        if encoded.sparse is not None:
            item["sparse"] = encoded.sparse[i]
        if encoded.multivector is not None:
            item["multivector"] = _vectors(encoded.multivector[i], job.head, job.encoding_format)
        data.append(item)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def tei_sparse_body(encoded: EncodedOutputs) -> list[list[dict[str, Any]]]:
    """TEI's `/embed_sparse` answer: per input, its non-zero entries as {"index", "value"}."""
    assert encoded.sparse is not None
    return [
        [{"index": i, "value": v} for i, v in zip(s["indices"], s["values"], strict=True)]
        for s in encoded.sparse
    ]
