"""Our bge-m3 outputs in a real vector database: qdrant-client's local mode holds a small
corpus's dense, sparse and multi-vector (MaxSim) outputs as named vectors, and its dense, sparse,
MaxSim, hybrid (prefetch + reciprocal rank fusion) and prefetch-then-MaxSim queries return the
hits of a brute-force search over FlagEmbedding's `BGEM3FlagModel` outputs of the same folder."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from embedserve.devtools.references import flag_m3_embedder
from embedserve.embedder import Embedder
from embedserve.retrieval.scores import maxsim
from tests.data.texts import MULTILINGUAL, QUERIES, RERANK_DOCS, passages

qdrant_client = pytest.importorskip("qdrant_client")
from qdrant_client import models  # noqa: E402

# 70-odd distinct texts: passages of one to eight sentences, other scripts, short queries
CORPUS = list(dict.fromkeys(passages()[:20] + MULTILINGUAL + QUERIES + RERANK_DOCS))
SEARCHES = ["how do vaccines work", "capital of france", "vitamin d", "Tokyo 東京"]
TOP = 5
CANDIDATES = 12  # each prefetch's limit


# NOTE: at the initializer's scale (std 0.02) a random encoder's attention is near uniform and
# its CLS state hardly depends on the input: every dense cosine is 0.9999 +- 1e-5, an order no
# two implementations agree on in fp32. Its matrices times 10 spread them (0.5 to 0.9).
WEIGHT_SCALE = 10.0


def spread_weights(folder: Path, out: Path) -> Path:
    """A copy of `folder` whose weight matrices (not the embeddings) are WEIGHT_SCALE larger."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(folder, out)
    weights = load_file(folder / "model.safetensors")
    scaled = {k: v * WEIGHT_SCALE if v.ndim == 2 and "embeddings" not in k else v
              for k, v in weights.items()}  # fmt: skip
    save_file(scaled, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def outputs(retrieval_folder, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """(ours for the corpus, ours for the searches, the reference's for both)."""
    try:
        m3 = flag_m3_embedder()
    except ModuleNotFoundError:
        pytest.skip("FlagEmbedding is not installed")
    folder = spread_weights(retrieval_folder("bge-m3-tiny"),
                            tmp_path_factory.mktemp("m3") / "bge-m3-spread")  # fmt: skip
    ours = Embedder(folder, device="cpu", dtype="float32")
    ref = m3(str(folder), use_fp16=False, devices="cpu")
    kw = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    return (ours.encode_outputs(CORPUS), ours.encode_outputs(SEARCHES),
            ref.encode(CORPUS, **kw), ref.encode(SEARCHES, **kw))  # fmt: skip


@pytest.fixture(scope="module")
def collection(outputs):  # type: ignore[no-untyped-def]
    docs = outputs[0]
    client = qdrant_client.QdrantClient(":memory:")
    dims = docs.dense.shape[1]
    client.create_collection(
        "corpus",
        vectors_config={
            "dense": models.VectorParams(size=dims, distance=models.Distance.DOT),
            "colbert": models.VectorParams(
                size=docs.multivector[0].shape[1],
                distance=models.Distance.DOT,
                multivector_config=models.MultiVectorConfig(
                    comparator=models.MultiVectorComparator.MAX_SIM
                ),
            ),
        },
        sparse_vectors_config={"sparse": models.SparseVectorParams()},
    )
    client.upsert(
        "corpus",
        points=[
            models.PointStruct(
                id=i,
                vector={
                    "dense": docs.dense[i].tolist(),
                    "sparse": models.SparseVector(**docs.sparse[i]),
                    "colbert": docs.multivector[i].tolist(),
                },
            )
            for i in range(len(CORPUS))
        ],
    )
    return client


def ranked(scores: dict[int, float], limit: int) -> list[int]:
    """Ids by score, best first; the reference's order must be unambiguous at our parity
    tolerance (two scores 1e-5 apart could swap with no error on either side)."""
    order = sorted(scores, key=lambda i: -scores[i])[:limit]
    gaps = [scores[a] - scores[b] for a, b in pairwise(order)]
    assert not gaps or min(gaps) > 1e-5, f"near-tied reference scores {gaps}"
    return order


def lexical(query: dict[str, float], doc: dict[str, float]) -> float | None:
    """FlagEmbedding's lexical weights' dot product; None with no token in common (a sparse
    index returns no such point)."""
    common = set(query) & set(doc)
    return sum(float(query[t]) * float(doc[t]) for t in common) if common else None


def reference_sparse(ref_docs, ref_query, limit: int) -> dict[int, float]:  # type: ignore[no-untyped-def]
    out = {}
    for i, weights in enumerate(ref_docs["lexical_weights"]):
        s = lexical(ref_query, weights)
        if s is not None:
            out[i] = s
    return {i: out[i] for i in sorted(out, key=lambda i: -out[i])[:limit]}


def rrf(rankings: Sequence[list[int]], k: int = 2) -> dict[int, float]:
    """Reciprocal rank fusion as Qdrant computes it: 1 / (k + rank) per ranking, rank from 0."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, i in enumerate(ranking):
            fused[i] = fused.get(i, 0.0) + 1.0 / (k + rank)
    return fused


def hits(response) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(p.id) for p in response.points]


def test_dense_sparse_and_maxsim_queries_return_the_references_hits(collection, outputs) -> None:  # type: ignore[no-untyped-def]
    _, queries, ref_docs, ref_queries = outputs
    for q in range(len(SEARCHES)):
        dense = collection.query_points(
            "corpus", query=queries.dense[q].tolist(), using="dense", limit=TOP
        )
        want = {i: float(ref_queries["dense_vecs"][q] @ d)
                for i, d in enumerate(ref_docs["dense_vecs"])}  # fmt: skip
        assert hits(dense) == ranked(want, TOP)
        sparse = collection.query_points(
            "corpus", query=models.SparseVector(**queries.sparse[q]), using="sparse", limit=TOP
        )
        want = reference_sparse(ref_docs, ref_queries["lexical_weights"][q], TOP)
        assert hits(sparse) == ranked(want, TOP)
        np.testing.assert_allclose([p.score for p in sparse.points],
                                   [want[i] for i in hits(sparse)], rtol=1e-4)  # fmt: skip
        late = collection.query_points(
            "corpus", query=queries.multivector[q].tolist(), using="colbert", limit=TOP
        )
        q_vecs = ref_queries["colbert_vecs"][q]
        want = {i: maxsim(q_vecs, d) for i, d in enumerate(ref_docs["colbert_vecs"])}
        assert hits(late) == ranked(want, TOP)
        np.testing.assert_allclose([p.score for p in late.points],
                                   [want[i] for i in hits(late)], rtol=1e-4)  # fmt: skip


def test_hybrid_queries_return_the_references_hits(collection, outputs) -> None:  # type: ignore[no-untyped-def]
    _, queries, ref_docs, ref_queries = outputs
    for q in range(len(SEARCHES)):
        prefetch = [
            models.Prefetch(query=queries.dense[q].tolist(), using="dense", limit=CANDIDATES),
            models.Prefetch(
                query=models.SparseVector(**queries.sparse[q]), using="sparse", limit=CANDIDATES
            ),
        ]
        dense = {i: float(ref_queries["dense_vecs"][q] @ d)
                 for i, d in enumerate(ref_docs["dense_vecs"])}  # fmt: skip
        sparse = reference_sparse(ref_docs, ref_queries["lexical_weights"][q], CANDIDATES)
        dense_top, sparse_top = ranked(dense, CANDIDATES), ranked(sparse, CANDIDATES)
        # fusion: the fused scores, since two documents can tie on rank sums
        fused = collection.query_points(
            "corpus", prefetch=prefetch, query=models.FusionQuery(fusion=models.Fusion.RRF),
            limit=TOP,
        )  # fmt: skip
        want = rrf([dense_top, sparse_top])
        got = {int(p.id): p.score for p in fused.points}
        assert len(got) == TOP
        assert all(abs(got[i] - want[i]) < 1e-9 for i in got)
        assert min(got.values()) >= sorted(want.values(), reverse=True)[TOP - 1] - 1e-9
        # the candidates of both, re-scored by MaxSim: the late-interaction rerank
        reranked = collection.query_points(
            "corpus", prefetch=prefetch, query=queries.multivector[q].tolist(),
            using="colbert", limit=TOP,
        )  # fmt: skip
        q_vecs = ref_queries["colbert_vecs"][q]
        pool = set(dense_top) | set(sparse_top)
        want = {i: maxsim(q_vecs, ref_docs["colbert_vecs"][i]) for i in pool}
        assert hits(reranked) == ranked(want, TOP)
