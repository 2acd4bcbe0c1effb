"""What a sparse or multi-vector model folder declares beyond its encoder: which outputs it has
(dense, sparse, multi-vector) and the settings of the heads that make them.

Three layouts, each a row of the retrieval-kind registry (`retrieval_kinds`), recognised by the
`is_*` test and read here once and validated by the `read_*` reader its row names:

- SPLADE (`splade`): a sentence-transformers `SparseEncoder` folder, a masked-LM checkpoint with
  `modules.json` naming `MLMTransformer` and `SpladePooling` (its `pooling_strategy` max or sum,
  `activation_function` relu or log1p_relu). Output: sparse.
- bge-m3 (`bge-m3`): an XLM-R encoder with `sparse_linear.pt` (hidden -> 1) and
  `colbert_linear.pt` (hidden -> colbert dim) beside it, as FlagEmbedding's `BGEM3FlagModel`
  loads them. Outputs: dense (CLS), sparse (lexical weights), multi-vector. The special tokens
  whose weights are dropped are the tokenizer's CLS, EOS, PAD and UNK.
- ColBERT (`colbert`): a PyLate folder (`config_sentence_transformers.json` `model_type`
  "ColBERT", a `pylate.models.Dense.Dense` projection). Output: multi-vector; the query and
  document markers, query length (expansion with the mask token), document length and the
  document skip-list come from that file, with PyLate's defaults.

No torch here: the gateway reads folders with this module too.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from embedserve.loading.family_configs import ModelLoadError

Output = Literal["dense", "sparse", "multivector"]
OUTPUTS: tuple[str, ...] = ("dense", "sparse", "multivector")

# bge-m3's head files, as FlagEmbedding saves them (torch.save of a Linear's state dict)
M3_SPARSE_HEAD = "sparse_linear.pt"
M3_COLBERT_HEAD = "colbert_linear.pt"


@dataclass(frozen=True)
class SpladeSpec:
    pooling: Literal["max", "sum"]  # over the tokens of each input
    activation: Literal["relu", "log1p_relu"]  # log1p(relu(x)), or log1p of that again


@dataclass(frozen=True)
class M3Spec:
    unused_ids: tuple[int, ...]  # token ids whose lexical weight is dropped (CLS, EOS, PAD, UNK)


@dataclass(frozen=True)
class ColbertSpec:
    dims: tuple[tuple[int, int, bool], ...]  # the Dense modules' (in, out, bias), in order
    dense_paths: tuple[str, ...]  # their folders inside the model folder
    query_prefix_id: int | None  # the marker token inserted after CLS (None: no marker)
    document_prefix_id: int | None
    query_length: int  # tokens of a query, its marker and expansion included
    document_length: int  # most tokens of a document, its marker included
    expansion: bool  # queries are filled up to query_length with the mask token
    attend_to_expansion: bool  # ... and the other tokens attend to those
    mask_id: int  # the expansion token
    skiplist_ids: tuple[int, ...]  # document tokens that get no vector (punctuation)

    @property
    def width(self) -> int:
        return self.dims[-1][1]


@dataclass(frozen=True)
class RetrievalSpec:
    """The outputs of a model folder and its heads' settings (one of the three set)."""

    kind: str  # its row of the registry (`retrieval_kinds.KIND_BY_NAME`)
    outputs: tuple[Output, ...]
    splade: SpladeSpec | None = None
    m3: M3Spec | None = None
    colbert: ColbertSpec | None = None
    # the width of each multi-vector row (0: none), known without the weights so a gateway can
    # bound an answer's size: ColBERT's projection, bge-m3's colbert_linear (hidden -> hidden,
    # FlagEmbedding's default; the engine checks the file against it)
    multivector_dims: int = 0


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None


def _modules(folder: Path) -> list[dict[str, Any]]:
    path = folder / "modules.json"
    return list(_json(path)) if path.exists() else []


def is_splade(folder: Path) -> bool:
    return any(str(m.get("type", "")).endswith("SpladePooling") for m in _modules(folder))


def is_bge_m3(folder: Path) -> bool:
    return (folder / M3_SPARSE_HEAD).exists() and (folder / M3_COLBERT_HEAD).exists()


def is_colbert(folder: Path) -> bool:
    path = folder / "config_sentence_transformers.json"
    if path.exists() and _json(path).get("model_type") == "ColBERT":
        return True
    return any(str(m.get("type", "")).startswith("pylate.") for m in _modules(folder))


class _Vocab:
    """Token ids by name from the folder's tokenizer.json (and its config's special tokens)."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer  # no torch

        path = folder / "tokenizer.json"
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception
            raise ModelLoadError(f"{path}: cannot read the tokenizer ({e})") from None
        cfg_path = folder / "tokenizer_config.json"
        self.config: dict[str, Any] = _json(cfg_path) if cfg_path.exists() else {}
        self.path = path

    def special(self, name: str) -> int | None:
        """The id of the tokenizer config's `name` ("cls_token", ...), if it has one."""
        token = self.config.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        return None if token is None else self.tokenizer.token_to_id(str(token))

    def id_of(self, token: str) -> int:
        """As transformers' convert_tokens_to_ids: an unknown token is UNK's id."""
        found = self.tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
        unk = self.special("unk_token")
        if unk is None:
            raise ModelLoadError(f"{self.path}: no token {token!r} and no unk_token")
        return unk


def _splade(folder: Path) -> SpladeSpec:
    for module in _modules(folder):
        if str(module.get("type", "")).endswith("SpladePooling"):
            cfg_path = folder / str(module.get("path", "")) / "config.json"
            cfg = _json(cfg_path) if cfg_path.exists() else {}
            pooling = cfg.get("pooling_strategy", "max")
            activation = cfg.get("activation_function", "relu")
            if pooling not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
                raise ModelLoadError(
                    f"{cfg_path}: SpladePooling {pooling!r} / {activation!r} is not supported; "
                    "expected pooling_strategy max or sum, activation_function relu or log1p_relu"
                )
            return SpladeSpec(pooling, activation)
    raise ModelLoadError(f"{folder / 'modules.json'}: no SpladePooling module")


def _m3(folder: Path) -> M3Spec:
    # the heads' widths are their files' shapes, read when the engine loads them
    vocab = _Vocab(folder)
    names = ("cls_token", "eos_token", "pad_token", "unk_token")
    return M3Spec(tuple(sorted({i for i in map(vocab.special, names) if i is not None})))


def _colbert(folder: Path, hidden: int) -> ColbertSpec:
    cfg_path = folder / "config_sentence_transformers.json"
    cfg: dict[str, Any] = _json(cfg_path) if cfg_path.exists() else {}
    dims: list[tuple[int, int, bool]] = []
    paths: list[str] = []
    width = hidden
    for module in _modules(folder):
        if not str(module.get("type", "")).endswith(".Dense"):
            continue
        sub = str(module.get("path", ""))
        dense = _json(folder / sub / "config.json")
        act = str(dense.get("activation_function", "Identity"))
        if not act.endswith("Identity") or dense.get("use_residual"):
            raise ModelLoadError(
                f"{folder / sub / 'config.json'}: only an Identity projection without residual "
                f"is supported (got {act!r})"
            )
        fan_in, fan_out = int(dense["in_features"]), int(dense["out_features"])
        if fan_in != width:
            raise ModelLoadError(f"{folder / sub}: in_features {fan_in} after a width of {width}")
        dims.append((fan_in, fan_out, bool(dense.get("bias", True))))
        paths.append(sub)
        width = fan_out
    if not dims:
        raise ModelLoadError(f"{folder}: a ColBERT folder needs its Dense projection module")
    vocab = _Vocab(folder)

    def marker(key: str, default: str) -> int | None:
        prefix = cfg.get(key, default)
        return None if prefix in ("", None) else vocab.id_of(str(prefix))

    mask = vocab.special("mask_token")
    if mask is None:  # PyLate pads queries with EOS where there is no mask token
        mask = vocab.special("eos_token")
    if mask is None:
        raise ModelLoadError(f"{vocab.path}: no mask (or EOS) token for query expansion")
    expansion = bool(cfg.get("do_query_expansion", True))
    words = cfg.get("skiplist_words")
    skip = list(string.punctuation) if words is None else [str(w) for w in words]
    return ColbertSpec(
        dims=tuple(dims),
        dense_paths=tuple(paths),
        query_prefix_id=marker("query_prefix", "[Q] "),
        document_prefix_id=marker("document_prefix", "[D] "),
        query_length=int(cfg.get("query_length") or 32),
        document_length=int(cfg.get("document_length") or 180),
        expansion=expansion,
        attend_to_expansion=expansion and bool(cfg.get("attend_to_expansion_tokens", False)),
        mask_id=mask,
        skiplist_ids=tuple(sorted({vocab.id_of(w) for w in skip})),
    )


def read_splade(base: RetrievalSpec, folder: Path, hidden: int) -> RetrievalSpec:
    return replace(base, splade=_splade(folder))


def read_m3(base: RetrievalSpec, folder: Path, hidden: int) -> RetrievalSpec:
    return replace(base, m3=_m3(folder), multivector_dims=hidden)


def read_colbert(base: RetrievalSpec, folder: Path, hidden: int) -> RetrievalSpec:
    colbert = _colbert(folder, hidden)
    return replace(base, colbert=colbert, multivector_dims=colbert.width)
