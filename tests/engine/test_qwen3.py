"""The Qwen3 model against Hugging Face `transformers` on the same random weights (CPU, fp32).

Folders come from `make_checkpoint` (what `embedserve make-checkpoint` writes) and load through
the normal loader. References:

- causal: `transformers.Qwen3Model` as it is; its last token (the appended `<|endoftext|>`).
- bidirectional: `Qwen3Model` with `attn_implementation="eager"` and a 4-D additive attention
  mask of zeros, shape [1, 1, n, n]: transformers 5 passes a 4-D mask through unchanged
  (`create_causal_mask` returns it as is) and eager attention adds it to the scores, so every
  token sees every token. A second reference sets `config.is_causal = False` (transformers 5's
  switch for bidirectional decoders); the test checks both references agree, and that they
  differ from the causal output, so the mask demonstrably took effect.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embedserve.core.tokenization import TextTokenizer
from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine

transformers = pytest.importorskip("transformers")

TEXTS = [
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "ok",
    "Rotary embeddings restart at position zero for every sequence in a packed batch.",
]


def cosine(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float(a @ b / (a.norm() * b.norm()))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny causal, last-token Qwen3 embedder (the Qwen3-Embedding layout)."""
    out = tmp_path_factory.mktemp("qwen3-tiny")
    return make_checkpoint(out, arch="qwen3-tiny", dtype="float32", seed=1)


@pytest.fixture(scope="module")
def tiny_bidirectional(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same shapes, bidirectional with mean pooling (the pplx-embed layout)."""
    out = tmp_path_factory.mktemp("qwen3-tiny-bi")
    return make_checkpoint(
        out, arch="qwen3-tiny", attention="bidirectional", dtype="float32", seed=2
    )


def token_ids(folder: Path, texts: list[str] = TEXTS) -> list[list[int]]:
    return TextTokenizer(folder / "tokenizer.json", 512).encode(texts)


def ours(engine: Engine, ids: list[list[int]]) -> np.ndarray:
    return engine.step(PackedBatch.from_token_lists(ids)).wait()


def hf_model(folder: Path, *, is_causal: bool = True) -> torch.nn.Module:
    config = transformers.AutoConfig.from_pretrained(folder)
    config.is_causal = is_causal
    return transformers.Qwen3Model.from_pretrained(
        folder, config=config, attn_implementation="eager", dtype=torch.float32
    ).eval()


@torch.no_grad()
def hf_hidden(model: torch.nn.Module, ids: list[int], *, full_mask: bool) -> torch.Tensor:
    """[n, H] last hidden states of one sequence; `full_mask`: no causal masking (see top)."""
    x = torch.tensor([ids])
    kwargs = {"attention_mask": torch.zeros(1, 1, len(ids), len(ids))} if full_mask else {}
    return model(input_ids=x, **kwargs).last_hidden_state[0]


def check_against_hf(
    folder: Path, engine: Engine, hf: torch.nn.Module, texts: list[str] = TEXTS
) -> list[float]:
    ids = token_ids(folder, texts)
    got = ours(engine, ids)
    cosines = []
    for i, seq in enumerate(ids):
        if engine.spec.attention == "causal":
            assert engine.spec.pooling == "last"
            ref = hf_hidden(hf, seq, full_mask=False)[-1]
        else:
            assert engine.spec.pooling == "mean"
            ref = hf_hidden(hf, seq, full_mask=True).mean(0)
        cosines.append(cosine(got[i], ref))
    assert min(cosines) >= 0.99999, cosines
    return cosines


def test_tiny_causal_last_token_matches_transformers(tiny: Path) -> None:
    engine = Engine.from_folder(tiny, device="cpu", dtype="float32")
    assert (engine.spec.family, engine.spec.attention, engine.spec.pooling) == (
        "qwen3",
        "causal",
        "last",
    )
    ids = token_ids(tiny)
    assert all(seq[-1] == 151643 for seq in ids)  # the EOS the folder's tokenizer appends
    check_against_hf(tiny, engine, hf_model(tiny))


def test_tiny_bidirectional_mean_matches_transformers(tiny_bidirectional: Path) -> None:
    folder = tiny_bidirectional
    engine = Engine.from_folder(folder, device="cpu", dtype="float32")
    assert (engine.spec.attention, engine.spec.pooling) == ("bidirectional", "mean")
    hf_full_mask = hf_model(folder)
    check_against_hf(folder, engine, hf_full_mask)

    seq = token_ids(folder)[1]
    full = hf_hidden(hf_full_mask, seq, full_mask=True)
    by_config = hf_hidden(hf_model(folder, is_causal=False), seq, full_mask=False)
    causal = hf_hidden(hf_full_mask, seq, full_mask=False)
    torch.testing.assert_close(full, by_config, rtol=1e-5, atol=1e-5)
    assert (full - causal).abs().max() > 1e-2  # the reference really is not causal

    # the override flag: the same folder run causally is no longer bidirectional
    causal_engine = Engine.from_folder(folder, device="cpu", dtype="float32", attention="causal")
    assert causal_engine.spec.attention == "causal"
    got_causal = ours(causal_engine, [seq])[0]
    assert cosine(got_causal, causal.mean(0)) >= 0.99999
    assert cosine(got_causal, full.mean(0)) < 0.9999


@pytest.mark.parametrize("kind", ["causal", "bidirectional"])
def test_alone_equals_in_a_mixed_batch(tiny: Path, kind: str) -> None:
    engine = Engine.from_folder(tiny, device="cpu", dtype="float32", attention=kind, pooling="mean")
    ids = token_ids(tiny)
    batch = ours(engine, ids)
    for i, seq in enumerate(ids):
        alone = ours(engine, [seq])[0]
        np.testing.assert_allclose(batch[i], alone, rtol=1e-5, atol=1e-5)
    # order inside the batch does not matter either
    reversed_batch = ours(engine, ids[::-1])[::-1]
    np.testing.assert_allclose(batch, reversed_batch, rtol=1e-5, atol=1e-5)


def test_sharded_and_prefixed_checkpoints_load_alike(tiny: Path, tmp_path: Path) -> None:
    """Shards + index, and a Qwen3ForCausalLM layout ('model.' prefix, lm_head ignored)."""
    single = Engine.from_folder(tiny, device="cpu", dtype="float32")
    ids = token_ids(tiny)
    expected = ours(single, ids)

    sharded = make_checkpoint(
        tmp_path / "sharded", arch="qwen3-tiny", dtype="float32", seed=1, max_shard_gb=0.01
    )
    assert not (sharded / "model.safetensors").exists()
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    np.testing.assert_array_equal(
        ours(Engine.from_folder(sharded, device="cpu", dtype="float32"), ids), expected
    )

    causal_lm = tmp_path / "causal_lm"
    shutil.copytree(tiny, causal_lm, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = {f"model.{k}": v for k, v in load_file(tiny / "model.safetensors").items()}
    tensors["lm_head.weight"] = torch.zeros_like(tensors["model.embed_tokens.weight"])
    save_file(tensors, causal_lm / "model.safetensors")
    cfg = json.loads((tiny / "config.json").read_text())
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    (causal_lm / "config.json").write_text(json.dumps(cfg))
    engine = Engine.from_folder(causal_lm, device="cpu", dtype="float32", pooling="last")
    np.testing.assert_array_equal(ours(engine, ids), expected)


def test_qwen3_0_6b_config_matches_transformers(tmp_path: Path) -> None:
    """The published 0.6B shapes (random bf16 weights, run in fp32): causal and bidirectional."""
    folder = make_checkpoint(tmp_path / "qwen3-0.6b", arch="qwen3-0.6b", seed=3)
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]) == (
        1024,
        28,
        3072,
    )
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (16, 8, 128)
    assert cfg["vocab_size"] == 151669
    hf = hf_model(folder)
    texts = TEXTS[:2]  # two short inputs keep this under a minute on two cores
    causal = Engine.from_folder(folder, device="cpu", dtype="float32")
    print("0.6B causal, last token: cosines", check_against_hf(folder, causal, hf, texts))
    del causal
    bidirectional = Engine.from_folder(
        folder, device="cpu", dtype="float32", attention="bidirectional", pooling="mean"
    )
    cosines = check_against_hf(folder, bidirectional, hf, texts)
    print("0.6B bidirectional, mean: cosines", cosines)
