"""A sentence-transformers folder of the older layout, its transformer in a subfolder, seen flat.

sentence-transformers once saved the transformer module in a folder of its own (`0_Transformer/`
or `0_BERT/`: config.json, the weights, the tokenizer, sentence_bert_config.json) beside the
other modules, and still loads such folders by the paths in `modules.json`. The rest of
embedserve reads a model folder flat (config.json at its root), so `flat_view` gives such a
folder a view of that shape: a folder of symbolic links in the user's cache (the transformer's
files, then every other entry of the folder) and a `modules.json` whose transformer path is the
root. Nothing is copied; the view is made once per folder and its listing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from embedserve.loading import cache_root
from embedserve.loading.family_configs import ModelLoadError

TRANSFORMER_TYPES = (
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.BERT",
)


def transformer_subfolder(folder: Path) -> str | None:
    """The subfolder holding the transformer of an older sentence-transformers folder (no
    config.json at its root; `modules.json` names it), else None."""
    modules_path = folder / "modules.json"
    if (folder / "config.json").exists() or not modules_path.exists():
        return None
    try:
        modules = json.loads(modules_path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{modules_path}: not readable JSON ({e})") from None
    for module in modules if isinstance(modules, list) else []:
        sub = module.get("path") if isinstance(module, dict) else None
        if module.get("type") in TRANSFORMER_TYPES and sub:
            if not (folder / sub / "config.json").exists():
                raise ModelLoadError(f"{folder / sub / 'config.json'}: not found (modules.json names {sub!r} as the transformer)")  # fmt: skip
            return str(sub)
    return None


def flat_view(folder: Path, cache: Path | None = None) -> Path:
    """`folder` itself, or for the older layout its flat view (made once, in the cache)."""
    sub = transformer_subfolder(folder)
    if sub is None:
        return folder
    folder = folder.resolve()
    names = sorted(p.name for p in folder.iterdir()) + sorted(
        p.name for p in (folder / sub).iterdir()
    )
    key = hashlib.sha256(f"{folder}\n{sub}\n{names}".encode()).hexdigest()[:24]
    view = (cache or cache_root() / "layouts") / key
    if view.is_dir():
        return view
    view.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".view-", dir=view.parent))
    for entry in (folder / sub).iterdir():  # the transformer's files at the root
        (tmp / entry.name).symlink_to(entry)
    for entry in folder.iterdir():  # the other modules and files, where the view has none
        if entry.name not in (sub, "modules.json") and not (tmp / entry.name).exists():
            (tmp / entry.name).symlink_to(entry)
    modules = json.loads((folder / "modules.json").read_text())
    for module in modules:
        if module.get("path") == sub:
            module["path"] = ""
    (tmp / "modules.json").write_text(json.dumps(modules, indent=2))
    try:
        tmp.rename(view)  # NOTE: atomic; a process beside this one may have made it first
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return view
