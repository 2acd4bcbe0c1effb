"""The document served at `/openapi.json`, snapshotted: for each kind of model (an embedder, a
reranker, a classifier, a model with sparse and multi-vector outputs, two models behind one
gateway) the document the app serves equals the one saved under `data/openapi/`, which the
hand-written literal of `gateway/openapi.py` built (main at ae898bc) before the document was
generated from the request types and the route table.

Equal as JSON values, and in the same key order (the API page lists the routes and fields in it).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from embedserve.gateway.app import GatewayApp
from embedserve.gateway.models import ServedModel, ServedModels
from embedserve.gateway.requests import Limits

DATA = Path(__file__).parent / "data" / "openapi"
EMBEDDER = Limits(hidden_size=384, max_inputs=2048, model_names=("minilm", "all-MiniLM-L6-v2"))
RERANKER = Limits(
    hidden_size=1, max_inputs=1000, model_names=("ce",), task="score", scoring="cross-encoder"
)
CLASSIFIER = Limits(hidden_size=768, max_inputs=64, model_names=("sst2",), task="classify")
M3 = Limits(
    hidden_size=1024,
    max_inputs=512,
    model_names=("bge-m3",),
    min_dimensions=128,
    default_output_dtype="bfloat16",
    max_chunks=7,
    outputs=("dense", "sparse", "multivector"),
    retrieval="bge-m3",
    multivector_dims=1024,
)
CASES = {
    "embedder": [EMBEDDER],
    "reranker": [RERANKER],
    "classifier": [CLASSIFIER],
    "bge_m3": [M3],
    "two_models": [EMBEDDER, M3],
}


def served_document(models: list[Limits]) -> bytes:
    served = ServedModels([ServedModel(limits, lambda: None) for limits in models])  # type: ignore[arg-type,return-value]
    app = GatewayApp(served, max_body_bytes=100_000)
    status, content_type, payload = asyncio.run(app.openapi(b""))
    assert status == 200 and content_type == b"application/json"
    return payload


def key_order(value: Any, where: str = "$") -> list[str]:
    """Every object's keys in order, by where the object is, so two documents' orders compare."""
    if isinstance(value, dict):
        found = [f"{where}: {', '.join(value)}"]
        for key, item in value.items():
            found += key_order(item, f"{where}.{key}")
        return found
    if isinstance(value, list):
        return [line for i, item in enumerate(value) for line in key_order(item, f"{where}[{i}]")]
    return []


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_served_document_is_the_snapshot(case: str) -> None:
    saved = json.loads((DATA / f"{case}.json").read_text(encoding="utf-8"))
    served = json.loads(served_document(CASES[case]))
    assert served == saved
    assert key_order(served) == key_order(saved)
