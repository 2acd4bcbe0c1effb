"""Sparse and multi-vector outputs against their reference libraries (CPU, fp32, random weights
in the published layouts from `make-checkpoint`): SPLADE vs sentence-transformers
`SparseEncoder`, bge-m3 vs FlagEmbedding `BGEM3FlagModel` (encode and compute_score), ColBERT vs
PyLate. Token ids equal the reference's; an input alone equals it inside a batch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.devtools.pylate_env import env_folder
from embedserve.devtools.references import flag_m3_embedder
from embedserve.embedder import Embedder
from embedserve.engine.pooler.sparse import SPLADE_BLOCK_TOKENS
from embedserve.engine.retrieval import read_pt_head
from embedserve.errors import InputError
from embedserve.loading.spec import ModelLoadError, read_model_spec
from embedserve.scorer import Scorer

TEXTS = [
    "what is late interaction retrieval?",
    "SPLADE expands queries and documents over the vocabulary, with weights.",
    "Zürich, 東京 and São Paulo: cities (and punctuation!) in one line...",
    "short",
    " ".join(["a passage of some length about sparse and dense retrieval models"] * 14),
]
QUERIES = ["what is colbert?", "sparse lexical weights for search"]
# PyLate's reference environment (pylate_reference.py runs from it): .venv/pylate-ref or
# $EMBEDSERVE_PYLATE_ENV, built by `python -m embedserve.devtools.pylate_env`
PYLATE_ENV = env_folder(Path(__file__).parents[2])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("retrieval")
    archs = ("splade-minilm-l6", "bge-m3-tiny", "answerai-colbert-small-v1")
    return {a: make_checkpoint(root / a, arch=a, dtype="float32", seed=5) for a in archs}


def test_the_spec_names_each_layouts_outputs(folders: dict[str, Path]) -> None:
    expected = {
        "splade-minilm-l6": ("splade", ("sparse",)),
        "bge-m3-tiny": ("bge-m3", ("dense", "sparse", "multivector")),
        "answerai-colbert-small-v1": ("colbert", ("multivector",)),
    }
    for arch, (family, outputs) in expected.items():
        spec = read_model_spec(folders[arch])
        assert (spec.family, spec.outputs) == (family, outputs)
    colbert = read_model_spec(folders["answerai-colbert-small-v1"]).retrieval
    assert colbert is not None and colbert.colbert is not None
    c = colbert.colbert
    assert (c.query_prefix_id, c.document_prefix_id, c.query_length, c.mask_id) == (1, 2, 32, 103)


def _alone_equals_batch(embedder: Embedder, **kw: object) -> None:
    batch = embedder.encode_outputs(TEXTS, **kw)  # type: ignore[arg-type]
    for i, text in enumerate(TEXTS):
        alone = embedder.encode_outputs([text], **kw)  # type: ignore[arg-type]
        if batch.dense is not None:
            assert alone.dense is not None
            np.testing.assert_allclose(alone.dense[0], batch.dense[i], atol=1e-6)
        if batch.sparse is not None:
            assert alone.sparse is not None
            assert alone.sparse[0]["indices"] == batch.sparse[i]["indices"]
            np.testing.assert_allclose(
                alone.sparse[0]["values"], batch.sparse[i]["values"], rtol=1e-5, atol=1e-6
            )
        if batch.multivector is not None:
            assert alone.multivector is not None
            np.testing.assert_allclose(alone.multivector[0], batch.multivector[i], atol=1e-6)


# -- SPLADE ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def splade(folders: dict[str, Path]) -> Embedder:
    return Embedder(folders["splade-minilm-l6"], device="cpu", dtype="float32")


def test_splade_equals_sparse_encoder(splade: Embedder, folders: dict[str, Path]) -> None:
    from sentence_transformers import SparseEncoder

    ref = SparseEncoder(str(folders["splade-minilm-l6"]), device="cpu")
    tokens = ref.tokenize(TEXTS)
    ref_ids = [
        ids[mask.bool()].tolist()
        for ids, mask in zip(tokens["input_ids"], tokens["attention_mask"], strict=True)
    ]
    assert splade.tokenize(TEXTS) == ref_ids
    expected = ref.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    ours = splade.encode_outputs(TEXTS)
    assert ours.dense is None and ours.multivector is None and ours.sparse is not None
    for row, vec in zip(expected, ours.sparse, strict=True):
        nz = np.flatnonzero(row)
        assert vec["indices"] == nz.tolist()
        # 1e-5 relative; a value near zero is a logit of sums that cancel, whose fp32 rounding
        # (~1e-7 of its terms, differing with the matmul's blocking) is up to 1e-6 absolute
        np.testing.assert_allclose(vec["values"], row[nz], rtol=1e-5, atol=1e-6)


def test_splade_alone_equals_batch_and_blocks_cut_sequences(splade: Embedder) -> None:
    _alone_equals_batch(splade)
    # a block size that cuts most sequences, and one of a single token: the same vectors
    heads = splade.engine.retrieval
    assert heads is not None and heads.splade is not None
    whole = splade.encode_outputs(TEXTS).sparse
    for block in (7, 1):
        heads.splade.block = block
        try:
            cut = splade.encode_outputs(TEXTS).sparse
        finally:
            heads.splade.block = SPLADE_BLOCK_TOKENS
        assert cut is not None and whole is not None
        for a, b in zip(whole, cut, strict=True):
            assert a["indices"] == b["indices"]
            np.testing.assert_allclose(a["values"], b["values"], rtol=1e-5, atol=1e-6)


def test_splade_never_holds_a_whole_batchs_logits(splade: Embedder) -> None:
    """The largest buffer while encoding a full 2,048-token batch is one block's logits, not
    the batch's [T, V]: measured with the profiler's per-op memory."""
    from torch.profiler import ProfilerActivity, profile

    vocab = splade.spec.vocab_size
    texts = [" ".join(["retrieval"] * 500)] * 4  # 4 x 502 tokens in one batch
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        splade.encode_outputs(texts, batch_tokens=2048)
    ops = [e for e in prof.events() if e.cpu_memory_usage > 0]
    largest = max(e.cpu_memory_usage for e in ops)
    batch_logits = 4 * 502 * vocab * 4
    assert largest <= SPLADE_BLOCK_TOKENS * vocab * 4 < batch_logits / 3


def test_sparse_only_models_refuse_dense_encode(splade: Embedder) -> None:
    with pytest.raises(InputError, match="no dense output"):
        splade.encode(TEXTS)
    with pytest.raises(InputError, match="outputs must be"):
        splade.encode_outputs(TEXTS, outputs=("multivector",))


# -- bge-m3 ---------------------------------------------------------------------------------


def _bge_m3_model():  # type: ignore[no-untyped-def]
    """FlagEmbedding's BGEM3FlagModel (`devtools.references`), or a skip without it."""
    try:
        return flag_m3_embedder()
    except ModuleNotFoundError:
        pytest.skip("FlagEmbedding is not installed")


@pytest.fixture(scope="module")
def bge_m3(folders: dict[str, Path]):  # type: ignore[no-untyped-def]
    model = _bge_m3_model()(str(folders["bge-m3-tiny"]), use_fp16=False, devices="cpu")
    return model, Embedder(folders["bge-m3-tiny"], device="cpu", dtype="float32")


def test_bge_m3_three_outputs_equal_flagembedding(bge_m3) -> None:  # type: ignore[no-untyped-def]
    ref, ours = bge_m3
    expected = ref.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    tokens = ref.tokenizer(TEXTS)["input_ids"]
    assert ours.tokenize(TEXTS) == tokens
    got = ours.encode_outputs(TEXTS)
    assert got.dense is not None and got.sparse is not None and got.multivector is not None
    assert cosines(got.dense, expected["dense_vecs"]).min() >= 0.99999
    np.testing.assert_allclose(ours.encode(TEXTS), got.dense, atol=1e-5)  # the graph path
    for vec, weights in zip(got.sparse, expected["lexical_weights"], strict=True):
        assert sorted(map(int, weights)) == vec["indices"]
        np.testing.assert_allclose(
            vec["values"], [weights[str(i)] for i in vec["indices"]], rtol=1e-5, atol=1e-6
        )
    for mine, theirs in zip(got.multivector, expected["colbert_vecs"], strict=True):
        assert mine.shape == theirs.shape
        assert cosines(mine, theirs).min() >= 0.99999


def test_bge_m3_scores_equal_compute_score(folders: dict[str, Path], bge_m3) -> None:  # type: ignore[no-untyped-def]
    ref, _ = bge_m3
    scorer = Scorer(folders["bge-m3-tiny"], device="cpu", dtype="float32")
    weights = [0.4, 0.2, 0.4]
    docs = TEXTS[1:]
    # batch_size=1: FlagEmbedding pads a batch's passages with zero vectors that MaxSim then
    # counts as 0-similarity tokens; one pair per batch has no padding
    expected = ref.compute_score(
        [(QUERIES[1], d) for d in docs], batch_size=1, weights_for_different_modes=weights
    )
    modes = scorer.score_modes(QUERIES[1], docs, weights=weights)
    for mode, values in expected.items():
        np.testing.assert_allclose(modes[mode], values, rtol=1e-5, atol=1e-6, err_msg=mode)
    combined = scorer.score(QUERIES[1], docs, weights=weights)
    np.testing.assert_allclose(combined, expected["colbert+sparse+dense"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ["splade-minilm-l6", "answerai-colbert-small-v1"])
def test_late_scores_name_the_query_or_document_refused(
    folders: dict[str, Path], arch: str
) -> None:
    """Its query and documents are embedded as `input` lists; the errors name what was sent."""
    scorer = Scorer(folders[arch], device="cpu", dtype="float32")
    with pytest.raises(InputError, match=r"^documents\[1\] is empty after") as caught:
        scorer.score(QUERIES[0], ["a document", "\u0000"])
    assert caught.value.param == "documents"
    with pytest.raises(InputError, match="^query is empty after") as caught:
        scorer.score("\u0000", ["a document"])
    assert caught.value.param == "query"


def test_bge_m3_alone_equals_batch(bge_m3) -> None:  # type: ignore[no-untyped-def]
    _alone_equals_batch(bge_m3[1])


def test_outputs_come_back_in_input_order_from_batches_cut_by_length(bge_m3) -> None:  # type: ignore[no-untyped-def]
    """The batches are cut from the inputs sorted by length (the long passage alone, the short
    ones together): each output of each input is where the input was, as when it runs alone."""
    embedder = bge_m3[1]
    texts = [TEXTS[4], TEXTS[3], TEXTS[1], TEXTS[0], TEXTS[2], TEXTS[3]]
    cut = embedder.encode_outputs(texts, batch_tokens=40)
    assert cut.dense is not None and cut.sparse is not None and cut.multivector is not None
    assert cut.tokens is not None and cut.tokens[0] > 40 > cut.tokens[1]
    for i, text in enumerate(texts):
        alone = embedder.encode_outputs([text])
        assert alone.dense is not None and alone.sparse is not None
        assert alone.multivector is not None and alone.tokens == [cut.tokens[i]]
        np.testing.assert_allclose(cut.dense[i], alone.dense[0], atol=1e-6)
        assert cut.sparse[i]["indices"] == alone.sparse[0]["indices"]
        np.testing.assert_allclose(cut.multivector[i], alone.multivector[0], atol=1e-6)


def test_bge_m3_heads_are_read_without_pickled_code(tmp_path: Path) -> None:
    """A head file holding any object but tensors is refused, with the conversion command;
    exactly a Linear's weight and bias is read."""
    path = tmp_path / "sparse_linear.pt"
    torch.save({"weight": torch.ones(1, 8), "bias": torch.zeros(1)}, path)
    assert read_pt_head(path, 8).weight.shape == (1, 8)
    torch.save(
        {"weight": torch.ones(1, 8), "bias": torch.zeros(1), "x": types.SimpleNamespace()}, path
    )
    with pytest.raises(ModelLoadError, match="not a plain tensor file.*safetensors"):
        read_pt_head(path, 8)
    torch.save({"weight": torch.ones(1, 8), "extra": torch.zeros(1)}, path)
    with pytest.raises(ModelLoadError, match="a Linear's weight"):
        read_pt_head(path, 8)


def test_multivector_size_limit(bge_m3) -> None:  # type: ignore[no-untyped-def]
    ours = bge_m3[1]
    with pytest.raises(InputError, match="over the limit of 1000 per call") as e:
        ours.encode_outputs(TEXTS, max_multivector_values=1000)
    assert e.value.code == "output_too_large"
    assert (
        ours.encode_outputs(
            TEXTS, outputs=("dense", "sparse"), max_multivector_values=1
        ).multivector
        is None
    )


# -- ColBERT (PyLate) -----------------------------------------------------------------------


# the folder's own settings, then PyLate's two other query modes: expansion tokens attended to,
# and no expansion at all (a query is then its own tokens)
COLBERT_VARIANTS = {
    "as-published": {},
    "attend-expansion": {"attend_to_expansion_tokens": True},
    "no-expansion": {"do_query_expansion": False},
}
# over the lengths: a query past query_length (32) is cut, a document past document_length (300)
# is cut at the end
LONG_QUERY = " ".join(["what do late interaction models score per token"] * 6)
LONG_DOCUMENT = " ".join(["ColBERT keeps one vector per token, punctuation aside."] * 40)
COLBERT_QUERIES = [*QUERIES, LONG_QUERY]
COLBERT_DOCUMENTS = [*TEXTS, LONG_DOCUMENT]


@pytest.fixture(scope="module")
def colbert_variants(
    folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The ColBERT folder under each of COLBERT_VARIANTS' settings (weights linked, not
    copied)."""
    base = folders["answerai-colbert-small-v1"]
    root = tmp_path_factory.mktemp("colbert-variants")
    out = {}
    for name, changes in COLBERT_VARIANTS.items():
        folder = root / name
        shutil.copytree(base, folder, copy_function=os.symlink)
        cfg_path = folder / "config_sentence_transformers.json"
        cfg = json.loads(cfg_path.read_text())
        cfg_path.unlink()
        cfg_path.write_text(json.dumps({**cfg, **changes}))
        out[name] = folder
    return out


@pytest.fixture(scope="module")
def pylate_outputs(
    colbert_variants: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, np.ndarray]]:
    if not (PYLATE_ENV / "pylate").exists():
        pytest.skip(
            f"PyLate's reference environment is missing ({PYLATE_ENV}): build it with "
            "`python -m embedserve.devtools.pylate_env` (README.md, Development)"
        )
    work = tmp_path_factory.mktemp("pylate")
    texts = {"queries": COLBERT_QUERIES, "documents": COLBERT_DOCUMENTS}
    (work / "in.json").write_text(json.dumps(texts))
    env = {**os.environ, "PYTHONPATH": str(PYLATE_ENV)}
    script = Path(__file__).with_name("pylate_reference.py")
    folders = [str(f) for f in colbert_variants.values()]
    args = [sys.executable, str(script), str(work / "in.json"), str(work), *folders]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: dict(np.load(work / f"{name}.npz")) for name in colbert_variants}


@pytest.mark.slow  # PyLate in a subprocess of its own environment: ~30 s on 2 cores
@pytest.mark.parametrize("variant", list(COLBERT_VARIANTS))
def test_colbert_equals_pylate(
    variant: str,
    colbert_variants: dict[str, Path],
    pylate_outputs: dict[str, dict[str, np.ndarray]],
) -> None:
    """Token ids (markers, expansion, cuts), the attended tokens, the vectors kept (the
    document skip-list) and each vector (projection, normalization) equal PyLate's; MaxSim
    ranks documents as PyLate's vectors do."""
    folder, theirs = colbert_variants[variant], pylate_outputs[variant]
    ours = Embedder(folder, device="cpu", dtype="float32")
    assert ours.colbert is not None
    for kind, texts, query in (
        ("queries", COLBERT_QUERIES, True),
        ("documents", COLBERT_DOCUMENTS, False),
    ):
        got = ours.encode_outputs(
            texts, input_type="query" if query else "document", truncate="end"
        ).multivector
        assert got is not None
        prepared = ours.colbert.prepare(texts, query=query, truncate="end")
        for i, mine in enumerate(got):
            assert prepared.seqs[i] == theirs[f"{kind}_ids_{i}"].tolist()
            visible = len(prepared.seqs[i]) if prepared.visible is None else prepared.visible[i]
            assert visible == int(theirs[f"{kind}_attended_{i}"].sum())
            ref = theirs[f"{kind}_{i}"]
            assert mine.shape == ref.shape == (prepared.vectors[i], ours.colbert.spec.width)
            assert cosines(mine, ref).min() >= 0.99999
            np.testing.assert_allclose(np.linalg.norm(mine, axis=1), 1.0, atol=1e-6)
    scorer = Scorer(folder, device="cpu", dtype="float32")
    n_docs = len(COLBERT_DOCUMENTS)
    for qi, query in enumerate(COLBERT_QUERIES):
        ref = np.array(
            [
                (theirs[f"queries_{qi}"] @ theirs[f"documents_{d}"].T).max(1).sum()
                for d in range(n_docs)
            ]
        )
        mine = scorer.score(query, COLBERT_DOCUMENTS, truncate="end")
        np.testing.assert_allclose(mine, ref, rtol=1e-5)
        assert np.argsort(-mine).tolist() == np.argsort(-ref).tolist()


def test_colbert_pylate_cases_cover_what_they_name(colbert_variants: dict[str, Path]) -> None:
    """The parity inputs reach what they are there for (no PyLate needed): the long query and
    document are cut, a document loses skip-list tokens, each variant's queries differ."""
    seen = {}
    for name, folder in colbert_variants.items():
        colbert = Embedder(folder, device="cpu", dtype="float32").colbert
        assert colbert is not None
        spec = colbert.spec
        docs = colbert.prepare(COLBERT_DOCUMENTS, query=False, truncate="end")
        assert len(docs.seqs[-1]) == spec.document_length
        assert any(v < len(s) for v, s in zip(docs.vectors, docs.seqs, strict=True))
        queries = colbert.prepare(COLBERT_QUERIES, query=True, truncate="end")
        assert len(queries.seqs[-1]) == spec.query_length
        seen[name] = (queries.seqs[0], queries.visible)
    assert seen["as-published"][1] is not None and seen["attend-expansion"][1] is None
    assert seen["as-published"][0] == seen["attend-expansion"][0]
    assert len(seen["no-expansion"][0]) < len(seen["as-published"][0])


def test_colbert_alone_equals_batch(folders: dict[str, Path]) -> None:
    ours = Embedder(folders["answerai-colbert-small-v1"], device="cpu", dtype="float32")
    _alone_equals_batch(ours, input_type="query")
    _alone_equals_batch(ours, input_type="document")
