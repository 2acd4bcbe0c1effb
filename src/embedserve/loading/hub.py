"""Models by Hugging Face Hub id (`org/name` or `org/name@revision`), in the Hub's own cache.

Only what embedserve loads is fetched: the config, safetensors weights (one file or shards and
their index), the tokenizer files and the sentence-transformers module configs; transformers'
pickled `pytorch_model.bin` (read with `torch.load(weights_only=True)`) only for a model that has
no safetensors weights; never code. The environment is the Hub's: `HF_HOME` / `HF_HUB_CACHE` choose the cache,
`HF_HUB_OFFLINE=1` reads only from it, `HF_TOKEN` authenticates. No torch here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
FILES = [
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "embedserve.json",
    "*/config.json",
]
# a model without safetensors weights: the pickled state dicts transformers reads instead
BIN_FILES = ["pytorch_model.bin", "pytorch_model*.bin", "pytorch_model.bin.index.json",
             "*/pytorch_model.bin"]  # fmt: skip


def _without_weights(folder: Path) -> bool:
    return not any(folder.glob("model*.safetensors"))


def is_hub_id(text: str) -> bool:
    return bool(HUB_ID.match(text))


def cache_dir() -> Path:
    """The Hub cache this process uses (read at each call, so a changed HF_HOME counts)."""
    explicit = os.environ.get("HF_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def fetch(model_id: str) -> Path:
    """The local folder of a Hub model (downloaded into the cache unless offline); a ValueError
    that names the id and the cache otherwise."""
    repo, _, revision = model_id.partition("@")
    try:
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise ValueError(
            f"model {model_id!r} is a Hugging Face Hub id, which needs huggingface-hub: "
            "pip install huggingface-hub (or pass a local folder)"
        ) from None
    cache = cache_dir()
    try:
        path = Path(_download(repo, revision, FILES, cache))
        if _without_weights(path):
            path = Path(_download(repo, revision, BIN_FILES, cache))
    except LocalEntryNotFoundError:
        if offline():
            raise ValueError(
                f"model {model_id!r} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE "
                "is set: fetch it once with the network on, or pass a local folder"
            ) from None
        raise ValueError(
            f"model {model_id!r}: the Hub cannot be reached and it is not in the cache ({cache})"
        ) from None
    except GatedRepoError:
        raise ValueError(
            f"model {model_id!r} is gated: accept its terms on the Hub and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise ValueError(
            f"model {model_id!r} is not on the Hub (or is private: set HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise ValueError(f"model {model_id!r}: no revision {revision!r}") from None
    return path


def _download(repo: str, revision: str, patterns: list[str], cache: Path) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(
        repo,
        revision=revision or None,
        allow_patterns=patterns,
        cache_dir=str(cache),
        local_files_only=offline(),
        token=os.environ.get("HF_TOKEN") or None,
    )
