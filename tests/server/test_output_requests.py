"""A sparse or multi-vector model's requests through the service (`server.output_requests`), in
front of a fake `encode_outputs` whose answers are easy to check: batches by kind, one forward per batch
for every output asked, each request's slice of it, and the refusals (the multi-vector size
bound among them)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import numpy as np
import pytest

from embedserve.contract.codec import decode_outputs_response
from embedserve.engine.batch import PackedBatch
from embedserve.engine.pooler.multivector import TokenVectors
from embedserve.engine.pooler.sparse import SparseRows
from embedserve.engine.retrieval import BatchOutputs
from embedserve.loading.retrieval import ColbertSpec, M3Spec, RetrievalSpec
from embedserve.retrieval.results import multivector_rows
from embedserve.server.output_requests import MultivectorLimit
from embedserve.server.service import EmbedService
from tests.server.test_service import HIDDEN, FakeEngine, req, with_server

DIMS = 4
ALL = ("dense", "sparse", "multivector")


class FakeOutputs:
    """Dense row of a sequence: [first id, length, 1, ...]; sparse: its distinct ids, each with
    its count; token vectors: [id, position, query, visible] per token."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], tuple[str, ...], bool, Any]] = []

    def __call__(self, batch: PackedBatch, outputs: tuple[str, ...], *, query: bool,
                 visible_keys: Any) -> BatchOutputs:  # fmt: skip
        seqs = np.split(batch.input_ids, batch.cu_seqlens[1:-1])
        self.calls.append(([int(s[0]) for s in seqs], outputs, query, visible_keys))
        dense = np.ones((len(seqs), HIDDEN), np.float32)
        dense[:, 0], dense[:, 1] = [s[0] for s in seqs], [len(s) for s in seqs]
        ids, counts = zip(*(np.unique(s, return_counts=True) for s in seqs), strict=True)
        sparse = SparseRows(np.cumsum([0, *map(len, ids)]), np.concatenate(ids).astype(np.int64),
                            np.concatenate(counts).astype(np.float32))  # fmt: skip
        shown = visible_keys or [len(s) for s in seqs]
        vectors = np.concatenate([
            np.stack([s, np.arange(len(s)), np.full(len(s), query), np.full(len(s), v)], 1)
            for s, v in zip(seqs, shown, strict=True)
        ]).astype(np.float32)  # fmt: skip
        return BatchOutputs(
            dense if "dense" in outputs else None,
            sparse if "sparse" in outputs else None,
            TokenVectors(batch.cu_seqlens.astype(np.int64), vectors)
            if "multivector" in outputs else None,
        )  # fmt: skip


def test_outputs_requests_are_batched_by_kind_and_each_gets_its_slice() -> None:
    engine, encoder = FakeEngine(), FakeOutputs()

    async def body(stub: Any, service: EmbedService) -> None:
        engine.gate = threading.Event()  # hold the first batch so the others queue up
        first = asyncio.ensure_future(stub(req([1, 1]), timeout=10))
        await asyncio.sleep(0.2)
        calls = [
            stub(req([5, 6, 6], [7], outputs=list(ALL), dimensions=4, normalize=False), timeout=10),
            stub(req([8, 9], outputs=list(ALL), dimensions=4, normalize=False), timeout=10),
            stub(req([3, 4, 4, 4], outputs=["multivector"], query=True, visible_tokens=[2]),
                 timeout=10),
            stub(req([2, 2]), timeout=10),
        ]  # fmt: skip
        tasks = [asyncio.ensure_future(c) for c in calls]
        await asyncio.sleep(0.3)
        engine.gate.set()
        await first
        a, b, q, plain = await asyncio.gather(*tasks)
        got = decode_outputs_response(a, 2, ALL)
        assert got.dense is not None and got.dense.tolist() == [[5, 3, 1, 1], [7, 1, 1, 1]]
        assert got.sparse == [{"indices": [5, 6], "values": [1.0, 2.0]},
                              {"indices": [7], "values": [1.0]}]  # fmt: skip
        assert got.multivector is not None
        assert [m[:, :2].tolist() for m in got.multivector] == [[[5, 0], [6, 1], [6, 2]], [[7, 0]]]
        got = decode_outputs_response(b, 1, ALL)
        assert got.sparse == [{"indices": [8, 9], "values": [1.0, 1.0]}]
        got = decode_outputs_response(q, 1, ("multivector",))
        assert got.multivector is not None and got.multivector[0][:, 2:].tolist() == [[1, 2]] * 4
        assert np.frombuffer(plain.embeddings, plain.dtype).reshape(plain.shape)[0, 0] == 2
        # the two document requests in one forward, the query one apart, the plain one apart
        assert [c[:3] for c in encoder.calls] == [
            ([5, 7, 8], ALL, False),
            ([3], ("multivector",), True),
        ]
        assert encoder.calls[1][3] == (2,) and engine.batches == [[1], [2]]

    with_server(engine, body, outputs_encoder=encoder, model_outputs=ALL)


@pytest.mark.parametrize(
    ("options", "served", "message"),
    [
        ({"outputs": ["sparse"]}, (), "no sparse or multi-vector outputs"),
        (
            {"outputs": ["sparse"]},
            ("multivector",),
            "no sparse output; its outputs are multivector",
        ),
        ({"outputs": ["multivector"], "visible_tokens": [3, 1]}, ALL, "2 entries for 1 sequences"),
        ({"outputs": ["multivector"], "visible_tokens": [4]}, ALL, "in [1, its sequence's length]"),
        ({"outputs": ["sparse"], "raw": True}, ALL, "no span_bounds, second_segment or raw"),
        ({"query": True}, ALL, "come with outputs"),
    ],
)
def test_bad_outputs_requests_are_invalid_argument(
    options: dict[str, Any], served: tuple[str, ...], message: str
) -> None:
    engine, encoder = FakeEngine(), FakeOutputs()

    async def body(stub: Any, service: EmbedService) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub(req([1, 2, 3], **options), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in e.value.details()
        assert encoder.calls == [] and engine.batches == []

    with_server(engine, body, outputs_encoder=encoder if served else None, model_outputs=served)


# a ColBERT model of 4 dims whose skip-list is token 9, and bge-m3's layout of the same width
COLBERT = RetrievalSpec(
    "colbert",
    ("multivector",),
    colbert=ColbertSpec(
        dims=((8, DIMS, False),),
        dense_paths=("1_Dense",),
        query_prefix_id=1,
        document_prefix_id=2,
        query_length=6,
        document_length=16,
        expansion=True,
        attend_to_expansion=False,
        mask_id=103,
        skiplist_ids=(9,),
    ),
    multivector_dims=DIMS,
)
M3 = RetrievalSpec("bge-m3", ALL, m3=M3Spec(unused_ids=(0,)), multivector_dims=DIMS)


def test_multivector_rows_are_the_engines_kept_tokens() -> None:
    ids, seqlens = np.array([5, 9, 6, 9, 7, 8, 9, 9]), np.array([5, 1, 2])
    assert multivector_rows(COLBERT, ids, seqlens, query=False).tolist() == [3, 1, 0]
    assert multivector_rows(COLBERT, ids, seqlens, query=True).tolist() == [5, 1, 2]
    assert multivector_rows(M3, ids, seqlens, query=False).tolist() == [4, 0, 1]


@pytest.mark.parametrize(
    ("spec", "seqs", "options", "size"),
    [
        # a document's 6 tokens, 2 of them skipped: 4 vectors x 4 dims = 16 floats, at the bound
        (COLBERT, [[5, 9, 6, 7, 9, 8]], {}, None),
        # two documents, 5 vectors: 20 floats
        (COLBERT, [[5, 9, 6, 7], [8, 8, 9]], {}, 20),
        # the same ids as a query keep every token: 6 vectors, 24 floats
        (COLBERT, [[5, 9, 6, 7, 9, 8]], {"query": True}, 24),
        # bge-m3: every token after CLS (5 vectors, 20 floats)
        (M3, [[0, 5, 6], [0, 7, 8, 9]], {}, 20),
        (M3, [[0, 5, 6], [0, 7, 8]], {}, None),
    ],
)
def test_a_call_over_the_multivector_bound_is_invalid_argument(
    spec: RetrievalSpec, seqs: list[list[int]], options: dict[str, Any], size: int | None
) -> None:
    """The server refuses a call whose multi-vector answer would exceed its bound (16 floats
    here) before queueing it, naming the size and the bound; a call at the bound, or one that
    asks no multi-vector output, runs."""
    engine, encoder = FakeEngine(), FakeOutputs()
    outputs = list(spec.outputs)

    async def body(stub: Any, service: EmbedService) -> None:
        call = stub(req(*seqs, outputs=outputs, **options), timeout=10)
        if size is None:
            got = decode_outputs_response(await call, len(seqs), spec.outputs)
            assert got.multivector is not None and len(got.multivector) == len(seqs)
        else:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"x {DIMS} dims = {size} floats, over the limit of 16 per call" in (
                e.value.details()
            )
            assert encoder.calls == []
            if "sparse" in spec.outputs:  # the same ids without the multi-vector output run
                await stub(req(*seqs, outputs=["dense", "sparse"]), timeout=10)
                assert len(encoder.calls) == 1

    limit = MultivectorLimit(spec, 16)
    with_server(
        engine, body, outputs_encoder=encoder, model_outputs=spec.outputs, multivector_limit=limit
    )
