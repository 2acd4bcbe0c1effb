"""What a server reads of an engine is one record the engine builds (`Engine.seam`): its step and
check, and the values the service, the ready line and the metrics read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine

BATCH = PackedBatch.from_token_lists([[101, 2023, 2003, 102], [101, 7592, 102]])


def test_a_dense_models_seam(minilm_path: Path) -> None:
    engine = Engine.from_folder(minilm_path, device="cpu", dtype="float32")
    seam = engine.seam()
    np.testing.assert_array_equal(seam.step(BATCH).wait(), engine.step(BATCH).wait())
    with pytest.raises(ValueError, match="token ids must be in"):
        seam.check(PackedBatch.from_token_lists([[101, 10**6]]))
    assert (seam.output_width, seam.batch_tokens) == (384, engine.batch_tokens)
    assert seam.output_rules == engine.spec.output_rules and seam.span_pooler is not None
    assert seam.outputs_encoder is None and seam.model_outputs == () and seam.retrieval is None
    assert seam.on_cpu and (seam.device, seam.dtype_name, seam.cpu_path) == (
        "cpu",
        "float32",
        "eager",
    )
    assert seam.stats is engine.stats
    assert seam.serving == (
        f"{engine.spec.path}, cpu, float32, 384 dims, bidirectional attention, mean pooling"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        seam.output_width = 1  # type: ignore[misc]


def test_a_sparse_and_multivector_models_seam(retrieval_folder) -> None:  # type: ignore[no-untyped-def]
    engine = Engine.from_folder(retrieval_folder("bge-m3-tiny"), device="cpu", dtype="float32")
    seam = engine.seam()
    assert seam.model_outputs == tuple(engine.spec.outputs) == ("dense", "sparse", "multivector")
    assert seam.retrieval is engine.spec.retrieval and seam.outputs_encoder is not None
    got = seam.outputs_encoder(BATCH, ("sparse",))
    want = engine.encode_outputs(BATCH, ("sparse",))
    assert got.sparse is not None and want.sparse is not None and got.sparse.indices.size
    for field in ("offsets", "indices", "values"):
        np.testing.assert_array_equal(getattr(got.sparse, field), getattr(want.sparse, field))
    assert "outputs dense, sparse, multivector" in seam.serving
