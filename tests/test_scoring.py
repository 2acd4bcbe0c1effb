"""Scoring against Hugging Face transformers on the same random weights (fp32, CPU): the
cross-encoder's logits, the LLM reranker's yes/no probability, the bi-encoder's cosine; the
rules for over-long pairs and bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.core.pairs import RERANK_BODY, RERANK_INSTRUCTION, RERANK_SUFFIX, RERANK_SYSTEM
from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.errors import InputError, InputTooLong
from embedserve.scorer import Scorer
from tests.data.texts import RERANK_DOCS, RERANK_QUERY

QUERY = RERANK_QUERY
DOCS = RERANK_DOCS


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ms-marco")
    return make_checkpoint(out, arch="ms-marco-minilm-l6", dtype="float32", seed=5, overwrite=True)


@pytest.fixture(scope="module")
def llm_reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen3-reranker")
    return make_checkpoint(out, arch="qwen3-reranker-tiny", dtype="float32", seed=6, overwrite=True)


@torch.inference_mode()
def test_cross_encoder_logits_match_transformers(cross_encoder: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    scorer = Scorer(cross_encoder, device="cpu", dtype="float32")
    assert scorer.kind == "cross-encoder"
    got = scorer.score(QUERY, DOCS, raw=True)
    tok = AutoTokenizer.from_pretrained(cross_encoder)
    hf = AutoModelForSequenceClassification.from_pretrained(cross_encoder).eval()
    enc = tok([QUERY] * len(DOCS), DOCS, padding=True, return_tensors="pt")
    want = hf(**enc).logits[:, 0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    # the folder's activation is sentence-transformers' Identity: scores are the logits
    np.testing.assert_array_equal(scorer.score(QUERY, DOCS), got)
    # a pair alone scores as inside the batch
    alone = np.array([scorer.score(QUERY, [d], raw=True)[0] for d in DOCS])
    np.testing.assert_allclose(alone, got, atol=1e-5, rtol=0)


def test_cross_encoder_ranks_as_sentence_transformers(cross_encoder: Path) -> None:
    from sentence_transformers import CrossEncoder

    scorer = Scorer(cross_encoder, device="cpu", dtype="float32")
    st = CrossEncoder(str(cross_encoder), device="cpu")
    want = st.predict([(QUERY, d) for d in DOCS])
    got = scorer.score(QUERY, DOCS)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    ranked = scorer.rerank(QUERY, DOCS, top_n=3)
    assert [r.index for r in ranked] == list(np.argsort(-want, kind="stable")[:3])
    assert [r.document for r in ranked] == [DOCS[r.index] for r in ranked]


@torch.inference_mode()
def test_llm_reranker_yes_probability_matches_transformers(llm_reranker: Path) -> None:
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    scorer = Scorer(llm_reranker, device="cpu", dtype="float32")
    assert scorer.kind == "llm-reranker"
    got = scorer.score(QUERY, DOCS)
    # the reference as Qwen3-Reranker's model card computes it
    tok = AutoTokenizer.from_pretrained(llm_reranker)
    hf = Qwen3ForCausalLM.from_pretrained(llm_reranker, torch_dtype=torch.float32).eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    head = RERANK_BODY.format(instruction=RERANK_INSTRUCTION, query=QUERY)
    want = []
    for d in DOCS:
        ids = tok(RERANK_SYSTEM + head + d + RERANK_SUFFIX, add_special_tokens=False).input_ids
        logits = hf(torch.tensor([ids])).logits[0, -1]
        want.append(torch.softmax(logits[[no, yes]].float(), dim=-1)[1].item())
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    raw = scorer.score(QUERY, DOCS, raw=True)  # log-odds of yes against no
    np.testing.assert_allclose(1 / (1 + np.exp(-raw)), want, atol=1e-4, rtol=0)


def test_bi_encoder_scores_are_the_cosine_of_embeddings() -> None:
    from embedserve.embedder import Embedder

    scorer = Scorer("minilm", device="cpu", dtype="float32")
    assert scorer.kind == "bi-encoder"
    embedder = Embedder("minilm", device="cpu", dtype="float32")
    q, d = embedder.encode(QUERY), embedder.encode(DOCS)
    np.testing.assert_allclose(scorer.score(QUERY, DOCS), d @ q, atol=1e-5)
    with pytest.raises(InputError, match="raw scores"):
        scorer.score(QUERY, DOCS, raw=True)


def test_a_bi_encoder_names_the_query_or_document_it_refuses() -> None:
    """The request core embeds them as `input` lists; the errors name what was passed."""
    scorer = Scorer("minilm", device="cpu", dtype="float32")
    for query, docs, where, param in (
        (QUERY, ["a", "\u0000"], r"documents\[1\]", "documents"),
        ("\u0000", DOCS, "query", "query"),
    ):
        with pytest.raises(InputError, match=f"^{where} is empty after the tokenizer") as caught:
            scorer.score(query, docs)
        assert (caught.value.param, caught.value.code) == (param, "invalid_value")
    with pytest.raises(InputTooLong, match=r"^documents\[2\] has \d+ tokens") as too_long:
        scorer.score(QUERY, ["a", "b", "word " * 600])
    assert (too_long.value.where, too_long.value.param) == ("documents[2]", "documents")
    assert too_long.value.code == "context_length_exceeded" and too_long.value.max_length == 256


def test_over_long_pairs_cut_the_document_never_the_query(cross_encoder: Path) -> None:
    from transformers import AutoTokenizer

    scorer = Scorer(cross_encoder, device="cpu", dtype="float32")
    long_doc = "vector search ranks documents " * 200
    with pytest.raises(InputTooLong, match=r"documents\[1\]"):
        scorer.score(QUERY, [DOCS[0], long_doc])
    assert scorer.pairs is not None
    tok = AutoTokenizer.from_pretrained(cross_encoder)
    for side, hf_side in (("end", "right"), ("start", "left")):
        tok.truncation_side = hf_side
        want = tok(QUERY, long_doc, truncation="only_second", max_length=512).input_ids
        got = scorer.pairs.prepare(QUERY, [long_doc], truncate=side).seqs[0]
        assert got == want, side
    with pytest.raises(InputError, match="query"):
        scorer.score("word " * 600, DOCS, truncate="end")


def test_llm_reranker_truncates_the_document(llm_reranker: Path) -> None:
    scorer = Scorer(llm_reranker, device="cpu", dtype="float32")
    assert scorer.pairs is not None
    scorer.pairs.max_length = 128  # a small limit for the test
    long_doc = "vector search ranks documents " * 100
    with pytest.raises(InputTooLong, match=r"documents\[0\]"):
        scorer.pairs.prepare(QUERY, [long_doc])
    for side in ("end", "start"):
        seq = scorer.pairs.prepare(QUERY, [long_doc], truncate=side).seqs[0]
        assert len(seq) == 128
        text = scorer.pairs.tokenizer._full.decode(seq, skip_special_tokens=False)
        assert QUERY in text and text.endswith(RERANK_SUFFIX), side


@pytest.mark.parametrize(
    ("query", "documents", "options", "words"),
    [
        (QUERY, [], {}, "documents is an empty list"),
        (None, DOCS, {}, "query must be a string"),
        ("", DOCS, {}, "query is an empty string"),
        (QUERY, ["fine", 3], {}, r"documents\[1\] must be a string"),
        (QUERY, "one string", {}, "documents must be a list"),
        (QUERY, [{"txt": "x"}], {}, r"documents\[0\] must be a string or"),
        (QUERY, DOCS, {"truncate": "chunk"}, "truncate must be"),
        (QUERY, DOCS, {"instruction": "x"}, "instruction applies to LLM rerankers"),
        (QUERY, DOCS, {"top_n": 0}, "top_n must be a positive integer"),
    ],
)
def test_bad_scoring_input(
    cross_encoder: Path, query: object, documents: object, options: dict, words: str
) -> None:
    scorer = Scorer(cross_encoder, device="cpu", dtype="float32")
    with pytest.raises(InputError, match=words):
        scorer.rerank(query, documents, **options)  # type: ignore[arg-type]


def test_documents_as_objects_and_embedder_refuses_a_reranker(cross_encoder: Path) -> None:
    from embedserve.embedder import Embedder
    from embedserve.loading.spec import ModelLoadError

    scorer = Scorer(cross_encoder, device="cpu", dtype="float32")
    a = scorer.score(QUERY, [{"text": d} for d in DOCS[:2]])  # type: ignore[list-item]
    np.testing.assert_array_equal(a, scorer.score(QUERY, DOCS[:2]))
    with pytest.raises(ModelLoadError, match="scoring model"):
        Embedder(cross_encoder, device="cpu", dtype="float32")


@pytest.mark.parametrize("which", ["cross_encoder", "llm_reranker"])
def test_the_fidelity_guard_runs_on_score_heads(which: str, request: pytest.FixtureRequest) -> None:
    from embedserve.engine.engine import Engine

    engine = Engine.from_folder(
        request.getfixturevalue(which), device="cpu", dtype="float32", fidelity=True
    )
    assert engine.fidelity_cosine is not None and engine.fidelity_cosine > 0.999
