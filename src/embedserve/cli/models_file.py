"""`serve --config models.toml`: several models, each with its own served name, device, dtype,
replicas and limits.

    [[model]]
    name = "minilm"              # the name clients send as `model` (default: the model's own)
    model = "minilm"             # folder, bundled name or Hub id (required)
    device = "cpu"
    max_batch_tokens = 2048

    [[model]]
    name = "ms-marco"
    model = "/models/ms-marco-MiniLM-L6"
    replicas = 2
    max_inputs = 256

A model's keys are the flags of `serve` that may differ between models (`PER_MODEL`), with
underscores: a key's type and default are its flag's (the config dataclass field, declared
once), and a key a model leaves out takes the flag's value from the command line. The other
flags (port, keys, Host rules, ...) are the whole serve's, on the command line.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedserve.cli.serve_options import ServeConfig
from embedserve.gateway.main import GatewayConfig
from embedserve.gateway.served import PER_MODEL_LIMITS, default_names
from embedserve.options import EngineOptions, option_key
from embedserve.server.main import ServerConfig

# The configs whose fields a model may set for itself, and those fields (`serve`'s own:
# --replicas).
PER_MODEL_SERVER = ("max_batch_tokens", "max_queued_tokens", "batch_wait_ms", "cpu_threads")
PER_MODEL_SERVE = ("num_replicas",)


def _per_model() -> dict[str, tuple[type, str, type]]:
    """key -> (config class, field name, value type), every key a model may have but `name`."""
    groups: list[tuple[type, tuple[str, ...]]] = [
        (EngineOptions, tuple(EngineOptions.__dataclass_fields__)),
        (ServerConfig, PER_MODEL_SERVER),
        (ServeConfig, PER_MODEL_SERVE),
        (GatewayConfig, PER_MODEL_LIMITS),
    ]
    keys = {}
    for cls, names in groups:
        for name in names:
            key, kind = option_key(cls, name)
            keys[key] = (cls, name, kind)
    return keys


@dataclass(frozen=True)
class ModelSection:
    """One `[[model]]` of a models file: its served name and its settings by config class."""

    name: str
    where: str  # "FILE: [[model]] N (NAME)", for errors
    settings: dict[type, dict[str, Any]]  # config class -> {field name: value}

    def of(self, cls: type) -> dict[str, Any]:
        return self.settings.get(cls, {})


def read_models_file(path: str | Path) -> list[ModelSection]:
    """The models of a models file, or a ValueError naming the file, the model and the key."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"--config {path}: cannot read it ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})") from None
    extra = sorted(set(doc) - {"model"})
    if extra:
        raise ValueError(f"{path}: unknown key {extra[0]!r}; the file holds [[model]] tables only")
    tables = doc.get("model")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise ValueError(f"{path}: expected one or more [[model]] tables")
    keys = _per_model()
    sections: list[ModelSection] = []
    seen: dict[str, str] = {}
    for i, table in enumerate(tables, 1):
        section = _section(path, i, table, keys)
        if section.name in seen:
            raise ValueError(
                f"{section.where}: name {section.name!r} is taken by {seen[section.name]}: give "
                "each model its own name"
            )
        seen[section.name] = section.where
        sections.append(section)
    return sections


def _section(
    path: Path, i: int, table: dict[str, Any], keys: dict[str, tuple[type, str, type]]
) -> ModelSection:
    model = table.get("model")
    name = table.get("name")
    where = f"{path}: [[model]] {i}"
    if not isinstance(model, str) or not model:
        raise ValueError(f"{where}: key 'model' (a folder, bundled name or Hub id) is required")
    # the name travels as NAME=MODEL and NAME:KEY=VALUE (`gateway.models.split_named`)
    if name is not None and (
        not isinstance(name, str) or not name or any(c in name for c in ":/=")
    ):
        raise ValueError(f"{where}: key 'name' must be a non-empty string without ':', '/' or '='")
    name = name or default_names(model)[0]
    where = f"{where} ({name})"
    settings: dict[type, dict[str, Any]] = {}
    for key, value in table.items():
        if key == "name":
            continue
        if key not in keys:
            known = ", ".join(["name", *keys])
            raise ValueError(f"{where}: unknown key {key!r} (a model's keys: {known})")
        cls, field_name, kind = keys[key]
        settings.setdefault(cls, {})[field_name] = _typed(where, key, value, kind)
    return ModelSection(name, where, settings)


def _typed(where: str, key: str, value: Any, kind: type) -> Any:
    """`value` if it is of the key's type (an integer for a float key too), else a ValueError."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise ValueError(
        f"{where}: key {key!r} must be {_WORDS.get(kind, kind.__name__)}, got "
        f"{type(value).__name__} {value!r}"
    )


_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
