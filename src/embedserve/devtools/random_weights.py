"""Random weights for a Hugging Face config, in safetensors under the names Hugging Face saves
them: a `Qwen3Model`, a `Qwen3ForCausalLM` (under `model.`, the output projection tied) or a
`BertForSequenceClassification` cross-encoder. normal(0, 0.02) matrices and biases (random, so
that a bias not loaded shows), norm scales one, LayerNorm biases zero."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def _bert_shapes(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of a `BertForSequenceClassification` checkpoint (one label), by saved name."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    e = "bert.embeddings."
    shapes: list[tuple[str, tuple[int, ...]]] = [
        (e + "word_embeddings.weight", (cfg["vocab_size"], h)),
        (e + "position_embeddings.weight", (cfg["max_position_embeddings"], h)),
        (e + "token_type_embeddings.weight", (cfg["type_vocab_size"], h)),
        (e + "LayerNorm.weight", (h,)),
        (e + "LayerNorm.bias", (h,)),
    ]
    for n in range(cfg["num_hidden_layers"]):
        p = f"bert.encoder.layer.{n}."
        for w in ("query", "key", "value"):
            shapes += [
                (f"{p}attention.self.{w}.weight", (h, h)),
                (f"{p}attention.self.{w}.bias", (h,)),
            ]
        shapes += [
            (p + "attention.output.dense.weight", (h, h)),
            (p + "attention.output.dense.bias", (h,)),
            (p + "attention.output.LayerNorm.weight", (h,)),
            (p + "attention.output.LayerNorm.bias", (h,)),
            (p + "intermediate.dense.weight", (i, h)),
            (p + "intermediate.dense.bias", (i,)),
            (p + "output.dense.weight", (h, i)),
            (p + "output.dense.bias", (h,)),
            (p + "output.LayerNorm.weight", (h,)),
            (p + "output.LayerNorm.bias", (h,)),
        ]
    shapes += [
        ("bert.pooler.dense.weight", (h, h)),
        ("bert.pooler.dense.bias", (h,)),
        ("classifier.weight", (1, h)),
        ("classifier.bias", (1,)),
    ]
    return shapes


def tensor_shapes(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of a Hugging Face checkpoint of this config, by its saved name: a
    `Qwen3Model`, a `Qwen3ForCausalLM` (under `model.`, the output projection tied) or a
    BERT cross-encoder."""
    if cfg["architectures"] == ["BertForSequenceClassification"]:
        return _bert_shapes(cfg)
    if cfg["architectures"] == ["Qwen3ForCausalLM"]:
        return [("model." + n, s) for n, s in _qwen3_shapes(cfg)]
    return _qwen3_shapes(cfg)


def _qwen3_shapes(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes: list[tuple[str, tuple[int, ...]]] = [("embed_tokens.weight", (cfg["vocab_size"], h))]
    for n in range(cfg["num_hidden_layers"]):
        p = f"layers.{n}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (nq, h)),
            (p + "self_attn.k_proj.weight", (nkv, h)),
            (p + "self_attn.v_proj.weight", (nkv, h)),
            (p + "self_attn.q_norm.weight", (d,)),
            (p + "self_attn.k_norm.weight", (d,)),
            (p + "self_attn.o_proj.weight", (h, nq)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (i, h)),
            (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
        ]
    shapes.append(("norm.weight", (h,)))
    return shapes


def write_weights(
    out: Path, cfg: dict[str, Any], *, seed: int, dtype: str, max_shard_bytes: int
) -> int:
    """Random weights in safetensors, sharded past `max_shard_bytes`; returns the parameter count."""
    import torch
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    gen = torch.Generator().manual_seed(seed)
    shapes = tensor_shapes(cfg)
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    total = 0
    for name, shape in tqdm(shapes, desc="random weights", unit="tensor", file=sys.stderr):
        if name.endswith("norm.weight") or name.endswith("LayerNorm.weight"):
            t = torch.ones(shape, dtype=torch_dtype)  # norm scales start at one, as in HF
        elif name.endswith("LayerNorm.bias"):
            t = torch.zeros(shape, dtype=torch_dtype)
        else:  # matrices, and biases (random, so that a bias not loaded shows)
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen)
            t = t.to(torch_dtype)
        size = t.numel() * t.element_size()
        if shards[-1] and used + size > max_shard_bytes:
            shards.append({})
            used = 0
        shards[-1][name] = t
        used += size
        total += t.numel()
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata=metadata)
        make_readable(out / "model.safetensors")
        return total
    weight_map: dict[str, str] = {}
    for k, shard in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata=metadata)
        make_readable(out / fname)
        weight_map.update(dict.fromkeys(shard, fname))
    index = {"metadata": {"total_size": total * shards[0][shapes[0][0]].element_size()}}
    index["weight_map"] = weight_map  # type: ignore[assignment]
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def make_readable(path: Path) -> None:
    """The mode any other file of the folder gets (safetensors writes weights as 0600, so a
    folder made by one user was unreadable to a server run by another)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
