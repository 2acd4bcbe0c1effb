"""`embedserve make-checkpoint` for the sparse and multi-vector layouts: SPLADE, bge-m3 and a
PyLate ColBERT, each a published model's exact config with random weights in the layout its
reference library loads (`loading.retrieval` reads them):

- SPLADE (`splade-v3`; `splade-minilm-l6` for tests: MiniLM-L6's shape with the same head): a
  `BertForMaskedLM` made by transformers (the decoder tied to the word embeddings), with
  sentence-transformers' sparse modules (`MLMTransformer`, `SpladePooling` max / relu), as
  `SparseEncoder` saves them; BERT uncased tokenizer (30,522 tokens).
- bge-m3 (`bge-m3`; `bge-m3-tiny`): XLM-R large with 8,194 positions, the dense modules (CLS
  pooling, Normalize) and FlagEmbedding's two heads beside it, `sparse_linear.pt` (hidden -> 1)
  and `colbert_linear.pt` (hidden -> hidden), written with `torch.save` of a Linear's state dict
  as FlagEmbedding writes them; XLM-R's 250,002-token tokenizer.
- ColBERT (`answerai-colbert-small-v1`): a BERT (384 wide, 12 layers) with PyLate's Dense
  projection to 96 (no bias) in `1_Dense`, and PyLate's settings in
  `config_sentence_transformers.json`: markers `[unused0]` / `[unused1]` (in the vocabulary, so
  PyLate adds no token), query length 32 with expansion, document length 300, the punctuation
  skip-list.

The weights come from `family_checkpoints.write_family_weights` (transformers' own classes, every
norm and bias moved off its initial value).
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from embedserve.devtools.family_checkpoints import EncoderArch, write_family_weights
from embedserve.devtools.st_modules import write_st_modules
from embedserve.devtools.tokenizer_sources import write_family_tokenizer

_BERT_BASE: dict[str, Any] = {
    "architectures": ["BertForMaskedLM"],
    "model_type": "bert",
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "type_vocab_size": 2,
    "vocab_size": 30522,
}
_MINILM: dict[str, Any] = {"hidden_size": 384, "intermediate_size": 1536}
_XLMR_LARGE_8K: dict[str, Any] = {
    "architectures": ["XLMRobertaModel"],
    "model_type": "xlm-roberta",
    "attention_probs_dropout_prob": 0.1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 8194,
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "position_embedding_type": "absolute",
    "type_vocab_size": 1,
    "vocab_size": 250002,
}

SPLADE_ARCHS: dict[str, dict[str, Any]] = {
    "splade-v3": _BERT_BASE,
    "splade-minilm-l6": {**_BERT_BASE, **_MINILM, "num_hidden_layers": 6},
}
M3_ARCHS: dict[str, dict[str, Any]] = {
    "bge-m3": _XLMR_LARGE_8K,
    "bge-m3-tiny": {
        **_XLMR_LARGE_8K,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
    },
}
COLBERT_ARCHS: dict[str, tuple[dict[str, Any], int]] = {  # (encoder config, projection width)
    "answerai-colbert-small-v1": ({**_BERT_BASE, **_MINILM, "architectures": ["BertModel"]}, 96),
}
RETRIEVAL_ARCHS: tuple[str, ...] = (*SPLADE_ARCHS, *M3_ARCHS, *COLBERT_ARCHS)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def _modules(out: Path, *entries: tuple[str, str]) -> None:
    """modules.json from (type, path) pairs."""
    modules = [
        {"idx": n, "name": str(n), "path": path, "type": kind}
        for n, (kind, path) in enumerate(entries)
    ]
    _write_json(out / "modules.json", modules)


def _encoder(out: Path, config: dict[str, Any], tokenizer: str, max_len: int, **kw: Any) -> None:
    """The encoder's weights (transformers), its config.json and its tokenizer."""
    write_family_weights(out, EncoderArch(config, tokenizer), seed=kw["seed"], dtype=kw["dtype"])
    saved = json.loads((out / "config.json").read_text())
    _write_json(out / "config.json", {**saved, **config})
    write_family_tokenizer(out, tokenizer, max_len)


def _write_splade(out: Path, config: dict[str, Any], **kw: Any) -> None:
    _encoder(out, config, "bert-uncased", 512, **kw)
    sparse = "sentence_transformers.sparse_encoder.models"
    _modules(out, (f"{sparse}.MLMTransformer", ""), (f"{sparse}.SpladePooling", "1_SpladePooling"))
    pooling = {
        "pooling_strategy": "max",
        "activation_function": "relu",
        "word_embedding_dimension": config["vocab_size"],
    }
    _write_json(out / "1_SpladePooling" / "config.json", pooling)
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": 512, "do_lower_case": False})
    st = {
        "model_type": "SparseEncoder",
        "prompts": {"query": "", "document": ""},
        "default_prompt_name": None,
        "similarity_fn_name": "dot",
    }
    _write_json(out / "config_sentence_transformers.json", st)


def _write_m3(out: Path, config: dict[str, Any], **kw: Any) -> None:
    import torch

    _encoder(out, config, "xlm-roberta", 8192, **kw)
    hidden = int(config["hidden_size"])
    write_st_modules(out, hidden=hidden, pooling="cls", max_seq_length=8192, prompts={})
    gen = torch.Generator().manual_seed(kw["seed"] + 7)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[kw["dtype"]]
    for name, width in (("sparse_linear.pt", 1), ("colbert_linear.pt", hidden)):
        head = {
            "weight": torch.randn(width, hidden, generator=gen) * hidden**-0.5,
            "bias": torch.randn(width, generator=gen) * 0.1,
        }
        torch.save({k: v.to(dtype) for k, v in head.items()}, out / name)


def _write_colbert(out: Path, config: dict[str, Any], width: int, **kw: Any) -> None:
    import torch
    from safetensors.torch import save_file

    _encoder(out, config, "bert-uncased", 512, **kw)
    hidden = int(config["hidden_size"])
    _modules(
        out,
        ("sentence_transformers.models.Transformer", ""),
        ("pylate.models.Dense.Dense", "1_Dense"),
    )
    dense = {
        "in_features": hidden,
        "out_features": width,
        "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity",
        "use_residual": False,
    }
    _write_json(out / "1_Dense" / "config.json", dense)
    gen = torch.Generator().manual_seed(kw["seed"] + 11)
    weight = (torch.randn(width, hidden, generator=gen) * hidden**-0.5).contiguous()
    save_file({"linear.weight": weight}, str(out / "1_Dense" / "model.safetensors"))
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": 299, "do_lower_case": False})
    st: dict[str, Any] = {
        "model_type": "ColBERT",
        "prompts": {},
        "default_prompt_name": None,
        "similarity_fn_name": "MaxSim",
        "query_prefix": "[unused0]",
        "document_prefix": "[unused1]",
        "query_length": 32,
        "document_length": 300,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": True,
    }
    _write_json(out / "config_sentence_transformers.json", st)


def make_retrieval_checkpoint(path: Path, name: str, *, seed: int, dtype: str) -> Path:
    """The folder for one `RETRIEVAL_ARCHS` entry (the caller checked `path`)."""
    path.mkdir(parents=True, exist_ok=True)
    if name in SPLADE_ARCHS:
        _write_splade(path, SPLADE_ARCHS[name], seed=seed, dtype=dtype)
    elif name in M3_ARCHS:
        _write_m3(path, M3_ARCHS[name], seed=seed, dtype=dtype)
    else:
        config, width = COLBERT_ARCHS[name]
        _write_colbert(path, config, width, seed=seed, dtype=dtype)
    return path
