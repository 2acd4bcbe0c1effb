"""The sentence-transformers modules of a made model folder (modules.json, Pooling, Dense,
Normalize, sentence_bert_config.json, the prompts), as sentence-transformers saves them: one
writer for every checkpoint maker, so that sentence-transformers loads each folder as it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_st_modules(
    out: Path,
    *,
    hidden: int,
    pooling: str,
    max_seq_length: int,
    prompts: dict[str, str],
    normalize: bool = True,
    dense: tuple[tuple[int, int], ...] = (),
) -> None:
    """Transformer, Pooling (`pooling`: "mean", "cls" or "last"), a Dense module per (in, out)
    of `dense` (random weights, no bias) and Normalize when `normalize`."""
    modules: list[dict[str, Any]] = []

    def module(kind: str, path: str) -> None:
        n = len(modules)
        entry = {
            "idx": n,
            "name": str(n),
            "path": path,
            "type": f"sentence_transformers.models.{kind}",
        }
        modules.append(entry)
        if path:
            (out / path).mkdir(exist_ok=True)

    module("Transformer", "")
    module("Pooling", "1_Pooling")
    pool_cfg = {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": pooling == "last",
        "include_prompt": True,
    }
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pool_cfg, indent=2))
    for n, (fan_in, fan_out) in enumerate(dense):
        sub = f"{len(modules)}_Dense"
        module("Dense", sub)
        dense_cfg = {
            "in_features": fan_in,
            "out_features": fan_out,
            "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity",
        }
        (out / sub / "config.json").write_text(json.dumps(dense_cfg, indent=2))
        _save_dense(out / sub, fan_in, fan_out, seed=1000 + n)
    if normalize:
        module("Normalize", f"{len(modules)}_Normalize")
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    st_cfg = {"max_seq_length": max_seq_length, "do_lower_case": False}
    (out / "sentence_bert_config.json").write_text(json.dumps(st_cfg, indent=2))
    cst = {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"}
    (out / "config_sentence_transformers.json").write_text(json.dumps(cst, indent=2))


def _save_dense(folder: Path, fan_in: int, fan_out: int, *, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(fan_out, fan_in, generator=gen) * fan_in**-0.5
    save_file({"linear.weight": weight.contiguous()}, str(folder / "model.safetensors"))
