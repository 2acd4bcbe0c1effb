"""Our all-MiniLM-L6-v2 against sentence-transformers and plain transformers on the same weights.

fp32 on the CPU: cosine >= 0.99999 for every vector (the issue's bar; in practice it is 1 - 1e-7).
The CPU's default bf16 (a CPU with native bf16, `engine.cpu`): cosine >= 0.999, the fidelity
guard's bar.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.embedder import Embedder
from embedserve.engine.cpu import native_bf16
from embedserve.errors import InputError
from tests.data.texts import WHITESPACE, all_texts

COSINE_MIN = 0.99999
BF16_COSINE_MIN = 0.999


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    t = all_texts()
    assert len(t) >= 100
    return t


def test_matches_sentence_transformers(
    minilm: Embedder, minilm_path: Path, texts: list[str]
) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_path), device="cpu")
    # sentence-transformers silently truncates at max_seq_length (256); we must be asked to.
    lengths = [len(e.ids) for e in minilm.tokenizer.encode_with_offsets(texts)]
    assert max(lengths) > 256, "the set must include inputs past the limit"
    ref = st.encode(texts, batch_size=16, convert_to_numpy=True)
    ours = minilm.encode(texts, truncate="end")
    assert ours.shape == ref.shape == (len(texts), 384)
    cos = cosines(ours, ref)
    worst = int(cos.argmin())
    assert cos.min() >= COSINE_MIN, f"text {worst} {texts[worst][:40]!r}: cosine {cos[worst]}"
    # both normalize: the vectors themselves agree, not only their directions
    np.testing.assert_allclose(ours, ref, atol=1e-5)


@pytest.mark.skipif(not native_bf16(), reason="this CPU has no native bf16: its default is fp32")
def test_default_bf16_matches_sentence_transformers(minilm_path: Path, texts: list[str]) -> None:
    from sentence_transformers import SentenceTransformer

    ours = Embedder(minilm_path, device="cpu")  # the CPU's default dtype, guard-checked
    assert ours.engine.dtype == torch.bfloat16
    st = SentenceTransformer(str(minilm_path), device="cpu")
    ref = st.encode(texts, batch_size=16, convert_to_numpy=True)
    cos = cosines(ours.encode(texts, truncate="end"), ref)
    worst = int(cos.argmin())
    assert cos.min() >= BF16_COSINE_MIN, f"text {worst} {texts[worst][:40]!r}: {cos[worst]}"


@pytest.mark.parametrize("method", ["cls", "last"])
def test_matches_transformers_pooling(minilm_path: Path, texts: list[str], method: str) -> None:
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_path))
    model = AutoModel.from_pretrained(str(minilm_path)).eval()
    ours = Embedder(minilm_path, device="cpu", pooling=method, dtype="float32")
    subset = texts[::3]
    got = ours.encode(subset, normalize=False, truncate="end")
    ref = []
    with torch.inference_mode():
        for text in subset:
            enc = tok(text, truncation=True, max_length=256, return_tensors="pt")
            hidden = model(**enc).last_hidden_state[0]  # [n, H]
            ref.append(hidden[0] if method == "cls" else hidden[-1])
    ref_np = torch.stack(ref).numpy()
    cos = cosines(got, ref_np)
    assert cos.min() >= COSINE_MIN, f"worst cosine {cos.min()} at {int(cos.argmin())}"
    np.testing.assert_allclose(got, ref_np, rtol=1e-4, atol=1e-4)


def test_alone_equals_in_batch(minilm: Embedder, texts: list[str]) -> None:
    batch = minilm.encode(texts, truncate="end")
    for i in range(0, len(texts), 7):
        alone = minilm.encode([texts[i]], truncate="end")[0]
        cos = float(alone @ batch[i])
        assert cos >= COSINE_MIN, f"text {i}: alone vs in batch cosine {cos}"


def test_small_batches_equal_one_big_batch(minilm: Embedder, texts: list[str]) -> None:
    big = minilm.encode(texts, truncate="end", batch_tokens=1 << 20)
    small = minilm.encode(texts, truncate="end", batch_tokens=300)
    assert cosines(big, small).min() >= COSINE_MIN


def test_attention_backends_agree(minilm_path: Path, texts: list[str]) -> None:
    subset = texts[:40]
    loop = Embedder(
        minilm_path, device="cpu", attention_backend="sdpa_loop", dtype="float32"
    ).encode(subset, truncate="end")
    mask = Embedder(
        minilm_path, device="cpu", attention_backend="block_mask", dtype="float32"
    ).encode(subset, truncate="end")
    assert cosines(loop, mask).min() >= COSINE_MIN


@torch.inference_mode()
def test_mpnet_positions_start_after_index_1_whatever_pad_token_id(tmp_path: Path) -> None:
    """transformers' MPNet fixes its padding index at 1 (positions 2, 3, ...) and ignores the
    config's pad_token_id; a folder saying pad_token_id 0 must not shift our positions."""
    import json

    transformers = pytest.importorskip("transformers")
    from embedserve.devtools.checkpoints import make_checkpoint
    from embedserve.engine.batch import PackedBatch
    from embedserve.engine.engine import Engine

    folder = make_checkpoint(tmp_path / "mpnet", arch="mpnet-tiny", dtype="float32", seed=5)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "pad_token_id": 0}))
    # no id 1 inside a text: transformers would count it as padding and not advance positions
    rng = np.random.default_rng(0)
    ids = [rng.integers(2, 500, n).tolist() for n in (5, 40, 120)]
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    assert model.config.pad_token_id == 0
    want = np.stack(
        [model(input_ids=torch.tensor([s])).last_hidden_state[0].mean(0).numpy() for s in ids]
    )
    got = (
        Engine.from_folder(folder, device="cpu", dtype="float32")
        .step(PackedBatch.from_token_lists(ids))
        .wait()
    )
    assert cosines(got, want).min() >= COSINE_MIN


def test_whitespace_only_texts_are_refused_not_embedded(minilm: Embedder) -> None:
    """sentence-transformers embeds them as [CLS][SEP]: we refuse them as "" is (issue 40)."""
    for text in WHITESPACE:
        with pytest.raises(InputError, match="empty after the tokenizer's normalization"):
            minilm.encode([text])
