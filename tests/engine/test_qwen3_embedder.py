"""Qwen3 embedders through the offline `Embedder`: sentence-transformers parity with prompts,
native pplx outputs, late chunking against a transformers reference, and `truncate="chunk"`."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embedserve.devtools.checkpoints import QUERY_PROMPT, make_checkpoint
from embedserve.embedder import Embedder
from embedserve.errors import InputTooLong

transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")

QUERIES = ["what is the capital of France?", "how do rotary position embeddings work"]
DOCS = [
    "Paris is the capital and most populous city of France.",
    "Rotary embeddings rotate query and key vectors by an angle that grows with position.",
]
EOS = 151643


@pytest.fixture(scope="module")
def causal_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(
        tmp_path_factory.mktemp("causal"), arch="qwen3-tiny", dtype="float32", seed=11
    )


@pytest.fixture(scope="module")
def bi_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(
        tmp_path_factory.mktemp("bi"),
        arch="qwen3-tiny",
        attention="bidirectional",
        dtype="float32",
        seed=12,
    )


@pytest.fixture(scope="module")
def causal(causal_folder: Path) -> Embedder:
    return Embedder(causal_folder, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def bi(bi_folder: Path) -> Embedder:
    return Embedder(bi_folder, device="cpu", dtype="float32")


def assert_same_vectors(a: np.ndarray, b: np.ndarray) -> None:
    a, b = np.atleast_2d(a).astype(np.float64), np.atleast_2d(b).astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cos.min() >= 0.99999, cos
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# --- sentence-transformers loads the same folder and gives the same vectors -------------------


def test_sentence_transformers_parity_with_prompts(causal_folder: Path, causal: Embedder) -> None:
    st = sentence_transformers.SentenceTransformer(str(causal_folder), device="cpu")
    # the folder's own query prompt, by name and by input_type
    expected = st.encode(QUERIES, prompt_name="query")
    assert_same_vectors(causal.encode(QUERIES, prompt_name="query"), expected)
    assert_same_vectors(causal.encode(QUERIES, input_type="query"), expected)
    # a free instruction in Qwen3-Embedding's format
    task = "Given a question, retrieve Wikipedia passages that answer it"
    expected = st.encode(QUERIES, prompt=f"Instruct: {task}\nQuery:")
    assert_same_vectors(causal.encode(QUERIES, instruction=task), expected)
    assert_same_vectors(causal.encode(QUERIES, input_type="query", instruction=task), expected)
    # documents: the folder's document prompt is empty
    expected = st.encode(DOCS, prompt_name="document")
    assert_same_vectors(causal.encode(DOCS, input_type="document"), expected)
    assert_same_vectors(causal.encode(DOCS), st.encode(DOCS))
    # the prompt really is applied: a query with and without it differ
    assert not np.allclose(causal.encode(QUERIES[0], input_type="query"), causal.encode(QUERIES[0]))


def test_sentence_transformers_parity_bidirectional(bi_folder: Path, bi: Embedder) -> None:
    """sentence-transformers runs transformers, which honours `"is_causal": false`."""
    st = sentence_transformers.SentenceTransformer(str(bi_folder), device="cpu")
    assert_same_vectors(bi.encode(DOCS, output_dtype="float32"), st.encode(DOCS))


def test_prompt_arguments(causal: Embedder) -> None:
    assert causal.prompt(input_type="query") == QUERY_PROMPT
    assert causal.prompt(input_type="document") == ""
    assert causal.prompt(instruction="Find code") == "Instruct: Find code\nQuery:"
    with pytest.raises(ValueError, match="only one of"):
        causal.encode(QUERIES, prompt="x", instruction="y")
    with pytest.raises(ValueError, match="only one of"):
        causal.encode(QUERIES, prompt_name="query", input_type="query")
    with pytest.raises(ValueError, match="documents take none"):
        causal.encode(DOCS, input_type="document", instruction="y")
    with pytest.raises(ValueError, match="input_type"):
        causal.encode(DOCS, input_type="passage")
    with pytest.raises(ValueError, match="non-empty"):
        causal.encode(DOCS, instruction="  ")


def test_native_output_is_the_default(bi: Embedder, causal: Embedder) -> None:
    pooled = bi.embed_ids(bi.tokenize(DOCS), batch_tokens=4096)
    default = bi.encode(DOCS)
    assert default.dtype == np.int8
    np.testing.assert_array_equal(default, np.rint(127 * np.tanh(pooled.astype(np.float64))))
    binary = bi.encode(DOCS, output_dtype="binary")
    np.testing.assert_array_equal(binary, np.packbits(pooled > 0, axis=1, bitorder="little"))
    assert causal.encode(DOCS).dtype == np.float32


# --- late chunking --------------------------------------------------------------------------


@functools.cache
def hf_tokenizer_and_model(folder: Path) -> tuple[Any, torch.nn.Module]:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.Qwen3Model.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    ).eval()
    return tok, model


def reference_chunks(
    folder: Path, chunks: list[str], separator: str, *, bidirectional: bool
) -> np.ndarray:
    """Chunk vectors computed independently: the transformers tokenizer's offsets of the joined
    document, transformers `Qwen3Model` hidden states of the whole document (a full attention
    mask when bidirectional, see test_qwen3.py), and a mean over each chunk's tokens (the tokens
    whose characters overlap the chunk's, special tokens excluded)."""
    tok, model = hf_tokenizer_and_model(folder)
    text = separator.join(chunks)
    enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    ids = torch.tensor([enc["input_ids"]])
    n = ids.shape[1]
    kwargs = {"attention_mask": torch.zeros(1, 1, n, n)} if bidirectional else {}
    with torch.no_grad():
        hidden = model(input_ids=ids, **kwargs).last_hidden_state[0].numpy()
    out, pos = [], 0
    for chunk in chunks:
        a, b = pos, pos + len(chunk)
        rows = [
            t
            for t, (s, e) in enumerate(enc["offset_mapping"])
            if not enc["special_tokens_mask"][t] and s < b and e > a
        ]
        out.append(hidden[rows].mean(0))
        pos = b + len(separator)
    return np.stack(out)


DOCUMENT = [
    "The Eiffel Tower was built for the 1889 World's Fair.",
    "It is 330 metres tall.",
    "Millions of people visit it every year.",
]


@pytest.mark.parametrize("kind", ["bidirectional", "causal"])
def test_late_chunking_matches_reference(bi_folder: Path, causal_folder: Path, kind: str) -> None:
    folder = bi_folder if kind == "bidirectional" else causal_folder
    embedder = Embedder(folder, device="cpu", dtype="float32", pooling="mean")
    expected = reference_chunks(folder, DOCUMENT, " ", bidirectional=kind == "bidirectional")
    [got] = embedder.encode_contextual([DOCUMENT], normalize=False, output_dtype="float32")
    assert got.shape == (3, embedder.dimensions)
    assert_same_vectors(got, expected)
    # context matters: a chunk embedded alone is a different vector
    alone = embedder.encode(DOCUMENT[1], normalize=False, output_dtype="float32")
    assert not np.allclose(alone, got[1], atol=1e-3)
    # several documents in one call come back in order, each as if alone
    both = embedder.encode_contextual(
        [DOCUMENT, DOCUMENT[:2]], normalize=False, output_dtype="float32"
    )
    assert_same_vectors(both[0], got)
    assert_same_vectors(
        both[1], reference_chunks(folder, DOCUMENT[:2], " ", bidirectional=kind == "bidirectional")
    )


def test_late_chunking_boundaries_come_from_offsets(bi_folder: Path, bi: Embedder) -> None:
    """Chunks cut inside a word: the straddling token belongs to both chunks, and the spans do
    not depend on how each chunk would tokenize alone."""
    chunks = ["The quick bro", "wn fox jumps over the lazy dog."]
    expected = reference_chunks(bi_folder, chunks, "", bidirectional=True)
    [got] = bi.encode_contextual([chunks], separator="", normalize=False, output_dtype="float32")
    assert_same_vectors(got, expected)


def test_late_chunking_bad_input(bi: Embedder) -> None:
    with pytest.raises(ValueError, match="input is an empty list of documents"):
        bi.encode_contextual([])
    with pytest.raises(ValueError, match=r"input\[0\] is a document with no chunks"):
        bi.encode_contextual([[]])
    with pytest.raises(ValueError, match=r"input\[1\]\[1\] is an empty chunk"):
        bi.encode_contextual([["a"], ["b", " "]])
    with pytest.raises(ValueError, match="list of chunk strings"):
        bi.encode_contextual(["just a string"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="over the limit of 2 per document"):
        bi.encode_contextual([["a", "b", "c"]], max_chunks=2)
    with pytest.raises(ValueError, match="between"):
        bi.encode_contextual([["a"]], dimensions=65)


# --- truncate="chunk": windows averaged -------------------------------------------------------

LONG = " ".join(f"sentence {i} talks about topic {i % 7}." for i in range(30))


@pytest.fixture(scope="module")
def short_limit(tmp_path_factory: pytest.TempPathFactory) -> Embedder:
    folder = make_checkpoint(
        tmp_path_factory.mktemp("short"),
        arch="qwen3-tiny",
        dtype="float32",
        seed=13,
        max_seq_length=32,
    )
    return Embedder(folder, device="cpu", dtype="float32")


def test_truncate_chunk_averages_windows(short_limit: Embedder) -> None:
    e = short_limit
    ids = e.tokenizer.encode_with_offsets([LONG])[0].ids
    assert ids[-1] == EOS and len(ids) > 3 * 32
    content = ids[:-1]
    windows = [[*content[i : i + 31], EOS] for i in range(0, len(content), 31)]
    pooled = e.embed_ids(windows, batch_tokens=4096)
    weights = np.array([len(w) - 1 for w in windows], dtype=np.float64)[:, None]
    expected = (pooled * weights).sum(0) / weights.sum()
    got = e.encode([LONG, "short one"], truncate="chunk", normalize=False)
    assert_same_vectors(got[0], expected)
    # an input within the limit is embedded as it is
    assert_same_vectors(got[1], e.encode("short one", normalize=False))
    with pytest.raises(InputTooLong):
        e.encode(LONG)


def test_truncate_chunk_repeats_the_prompt(short_limit: Embedder) -> None:
    e = short_limit
    prompt_ids = e.tokenizer.encode_with_offsets([QUERY_PROMPT])[0].ids[:-1]  # without the EOS
    content = e.tokenizer.encode_with_offsets([LONG])[0].ids[:-1]
    width = 32 - len(prompt_ids) - 1
    windows = [prompt_ids + content[i : i + width] + [EOS] for i in range(0, len(content), width)]
    pooled = e.embed_ids(windows, batch_tokens=4096)
    weights = np.array([len(w) - len(prompt_ids) - 1 for w in windows], dtype=np.float64)[:, None]
    expected = (pooled * weights).sum(0) / weights.sum()
    got = e.encode(LONG, input_type="query", truncate="chunk", normalize=False)
    assert_same_vectors(got, expected)
